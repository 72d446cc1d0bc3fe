package elector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Config describes one instance's candidacy.
type Config struct {
	// ID is this instance's id; it is written into the election keys it holds.
	ID string
	// URL is how peers reach this instance (its advertise URL); may be empty.
	URL string
	// TTL is the lease TTL requested from the store. The lease is renewed every TTL/3.
	TTL time.Duration
	// DrainTimeout bounds how long a resigning leader waits for admitted requests to finish
	// before it lets go of the key anyway.
	DrainTimeout time.Duration
	// Backend is the coordination store. The candidate closes it in Close.
	Backend Backend
	// Logger receives state changes; nil discards them.
	Logger *zap.Logger
	// Now reads the clock; nil means time.Now. It must return times with a monotonic
	// reading. Tests move it forward to simulate a pause.
	Now func() time.Time
}

// MinTTL is the smallest lease TTL the elector accepts. etcd itself raises TTLs below about
// 1.5 election timeouts, so shorter ones would not mean what they say.
const MinTTL = time.Second

// Candidate is one instance taking part in elections. It holds one lease at a time, shared by
// all its elections (so a fleet costs the store one renewal per instance per TTL/3, however
// many elections there are), and runs one campaign loop per election.
type Candidate struct {
	cfg            Config
	now            func() time.Time
	requestTimeout time.Duration
	drainTimeout   atomic.Int64 // a time.Duration; the newest config's
	logger         atomic.Pointer[zap.Logger]
	trouble        troubleLog
	lastContact    atomic.Int64 // Unix nanoseconds of the last successful grant or renewal
	observer       atomic.Pointer[observerBox]

	ctx    context.Context // cancelled by Close: ends every loop
	cancel context.CancelFunc

	startOnce sync.Once
	closeOnce sync.Once
	loops     sync.WaitGroup

	mu        sync.Mutex
	current   *lease        // the lease in use; nil while there is none
	leaseWake chan struct{} // closed (and replaced) whenever current changes
	abandoned LeaseID       // the last lease given up, whose keys may linger until it expires
	elections map[string]*Election
	closed    bool
}

// NewCandidate checks cfg and returns an idle candidate: nothing talks to the store until
// Start.
func NewCandidate(cfg Config) (*Candidate, error) {
	switch {
	case cfg.ID == "":
		return nil, errors.New("elector: instance id is empty")
	case cfg.TTL < MinTTL:
		return nil, fmt.Errorf("elector: ttl %s is below the minimum %s", cfg.TTL, MinTTL)
	case cfg.Backend == nil:
		return nil, errors.New("elector: no backend")
	case cfg.DrainTimeout < 0:
		return nil, fmt.Errorf("elector: drain timeout %s is negative", cfg.DrainTimeout)
	}
	c := &Candidate{
		cfg:       cfg,
		now:       cfg.Now,
		leaseWake: make(chan struct{}),
		elections: make(map[string]*Election),
		// A renewal that takes longer than a third of the TTL is as good as failed: the
		// next one is due. A second is the floor so a slow disk fsync is not a failure.
		requestTimeout: max(time.Second, cfg.TTL/3),
	}
	if c.now == nil {
		c.now = time.Now
	}
	c.SetLogger(cfg.Logger)
	c.SetDrainTimeout(cfg.DrainTimeout)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// TTL is the lease TTL the candidate asks for.
func (c *Candidate) TTL() time.Duration { return c.cfg.TTL }

// SetLogger replaces the logger; a long-lived candidate follows the logging config of the
// newest configuration that uses it.
func (c *Candidate) SetLogger(l *zap.Logger) {
	if l == nil {
		l = zap.NewNop()
	}
	c.logger.Store(l)
}

func (c *Candidate) log() *zap.Logger { return c.logger.Load() }

// SetDrainTimeout changes how long a handover waits for admitted requests to finish; a
// config reload may change it without starting a new candidacy.
func (c *Candidate) SetDrainTimeout(d time.Duration) { c.drainTimeout.Store(int64(max(0, d))) }

// HandoverTimeout is how long Close or a resign may take at most: the drain, then a
// request to the store. Callers give their context at least this much.
func (c *Candidate) HandoverTimeout() time.Duration {
	return time.Duration(c.drainTimeout.Load()) + 2*c.requestTimeout
}

// Start begins keeping a lease; the elections started with Election.Start campaign as soon
// as there is one. It returns at once and is idempotent.
func (c *Candidate) Start() {
	c.startOnce.Do(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			return
		}
		c.loops.Add(1)
		go func() {
			defer c.loops.Done()
			c.keepLease(c.ctx)
		}()
	})
}

// Election returns the named election, creating it on first use, and counts one more user
// of it. Every call must be matched by one Release. The election does not campaign until
// its Start is called.
func (c *Candidate) Election(name string) *Election {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.elections[name]
	if !ok {
		e = newElection(c, name)
		c.elections[name] = e
	}
	e.users++
	return e
}

// Elections lists the elections this candidate takes part in, in no particular order.
func (c *Candidate) Elections() []*Election {
	c.mu.Lock()
	defer c.mu.Unlock()
	list := make([]*Election, 0, len(c.elections))
	for _, e := range c.elections {
		list = append(list, e)
	}
	return list
}

// LastContact is when the store last confirmed this candidate's lease (zero if never).
func (c *Candidate) LastContact() time.Time {
	if ns := c.lastContact.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Release drops one user of e. When the last one is gone, e hands leadership over (see
// Resign) and stops campaigning; it blocks until then, at most about DrainTimeout plus one
// store request.
func (c *Candidate) Release(e *Election) {
	c.mu.Lock()
	e.users--
	last := e.users == 0
	if last && c.elections[e.name] == e {
		delete(c.elections, e.name)
	}
	c.mu.Unlock()
	if last {
		e.stop()
	}
}

// Leave hands over every election this instance leads and never campaigns again, but keeps
// following the elections, so that requests still arriving (say, while the HTTP server
// shuts down) can be sent on to the successors. Close ends it. It blocks until every
// handover is done or ctx ends.
func (c *Candidate) Leave(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(c.Elections()))
	for _, e := range c.Elections() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.Resign(ctx, forever)
		}()
	}
	wg.Wait()
	close(errs)
	var err error
	for e := range errs {
		err = errors.Join(err, e)
	}
	return err
}

// Close hands over every election this instance leads and leaves the fleet: it stops
// admitting new gated requests, waits (up to DrainTimeout) for admitted ones to finish, then
// revokes its lease, which deletes its keys at once so that a follower takes over without
// waiting for the TTL. It blocks until done or ctx ends.
func (c *Candidate) Close(ctx context.Context) error {
	var err error
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		elections := make([]*Election, 0, len(c.elections))
		for _, e := range c.elections {
			elections = append(elections, e)
		}
		c.mu.Unlock()

		var drains sync.WaitGroup
		for _, e := range elections {
			drains.Add(1)
			go func() {
				defer drains.Done()
				e.handOver(ctx, forever)
			}()
		}
		drains.Wait()

		c.cancel()
		c.loops.Wait()
		c.mu.Lock()
		l := c.current
		c.mu.Unlock()
		if l != nil {
			l.giveUp()
			rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
			err = c.cfg.Backend.Revoke(rctx, l.id)
			cancel()
			c.setLease(nil)
		}
		for _, e := range elections {
			e.publishAlone("shut down")
		}
		if cerr := c.cfg.Backend.Close(); err == nil {
			err = cerr
		}
		if l != nil {
			c.log().Info("left all elections", zap.String("self", c.cfg.ID), zap.Error(err))
		}
	})
	return err
}

// waitLease blocks until there is a usable lease and returns it, or nil once ctx ends.
func (c *Candidate) waitLease(ctx context.Context) *lease {
	for {
		c.mu.Lock()
		l, wake := c.current, c.leaseWake
		c.mu.Unlock()
		if l != nil {
			return l
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
	}
}

// processLeases holds the leases of every candidate in this process. When a reload changes
// how an instance campaigns (its ttl, say), the new candidacy starts while the old one still
// holds the key under the same instance id; that is a handover, not a duplicate id.
var processLeases sync.Map // LeaseID -> *Candidate

func (c *Candidate) setLease(l *lease) {
	c.mu.Lock()
	if c.current != nil {
		processLeases.Delete(c.current.id)
	}
	if l != nil {
		processLeases.Store(l.id, c)
	}
	if c.current != nil && l == nil {
		c.abandoned = c.current.id
	}
	c.current = l
	close(c.leaseWake)
	c.leaseWake = make(chan struct{})
	c.mu.Unlock()
}

// own reports whether id is this candidate's lease, current or just given up: under
// either, this candidate admits nothing it does not know about.
func (c *Candidate) own(id LeaseID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return (c.current != nil && c.current.id == id) || c.abandoned == id
}

// ours reports whether id is a lease of this process: this candidate's own, or another
// candidacy's of this process that is being replaced (not a duplicate instance_id).
func (c *Candidate) ours(id LeaseID) bool {
	if c.own(id) {
		return true
	}
	_, sibling := processLeases.Load(id)
	return sibling
}

// LeaseRemaining is how long the current lease's deadline is ahead; zero without a lease.
func (c *Candidate) LeaseRemaining() time.Duration {
	c.mu.Lock()
	l := c.current
	c.mu.Unlock()
	if l == nil {
		return 0
	}
	return l.remaining(c.now())
}

// keepLease is the lease loop: grant a lease, renew it every TTL/3 for as long as the store
// confirms it in time, and when it cannot, give it up and start over.
func (c *Candidate) keepLease(ctx context.Context) {
	retry := newBackoff(100*time.Millisecond, min(5*time.Second, c.cfg.TTL))
	for {
		sent := c.now()
		rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
		id, granted, err := c.cfg.Backend.Grant(rctx, c.cfg.TTL)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrStoreRewound) {
				// The lease came from a store gone back in time; the next one is of its
				// new history.
				c.log().Warn("lease granted by a rewound store dropped; asking for another", zap.String("self", c.cfg.ID), zap.Error(err))
			} else {
				c.storeFailed("grant", err)
			}
			if !retry.wait(ctx) {
				return
			}
			continue
		}
		c.trouble.succeeded(c.log())
		c.lastContact.Store(time.Now().UnixNano())
		retry.reset()
		l := newLease(id)
		l.extend(sent, granted, safetyMargin(granted))
		c.setLease(l)
		c.log().Debug("lease granted", zap.Int64("lease", int64(id)), zap.Duration("ttl", granted))

		reason := c.renew(ctx, l, granted, sent)
		if ctx.Err() != nil {
			return // Close revokes the lease itself, after draining
		}
		logLost := c.log().Warn
		if reason == reasonRewound {
			logLost = c.log().Error
		}
		logLost("lease lost", zap.String("self", c.cfg.ID), zap.Int64("lease", int64(id)), zap.String("reason", reason))
		l.giveUp()
		c.setLease(nil)
		// Revoking deletes our keys now rather than at expiry, so that the fleet does not
		// wait out the TTL; if the store is unreachable the lease expires by itself.
		go func() {
			rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
			defer cancel()
			_ = c.cfg.Backend.Revoke(rctx, id)
		}()
	}
}

// reasonRewound is why a lease is given up when the store went back in time: whatever it
// confirmed before, this lease included, belongs to a history the store no longer has.
const reasonRewound = "the store's revision went backwards (restored from a snapshot?)"

// renew keeps l alive until it cannot, and returns why it stopped ("" when ctx ended).
func (c *Candidate) renew(ctx context.Context, l *lease, ttl time.Duration, sent time.Time) string {
	interval := ttl / 3
	retryAfter := max(100*time.Millisecond, ttl/20)
	next := sent.Add(interval)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := c.now()
		if !l.valid(now) {
			return "no renewal succeeded before the lease deadline"
		}
		timer.Reset(min(next.Sub(now), l.remaining(now)))
		select {
		case <-ctx.Done():
			return ""
		case <-timer.C:
		}
		sent = c.now()
		if !l.valid(sent) {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, min(c.requestTimeout, l.remaining(sent)))
		granted, err := c.cfg.Backend.Renew(rctx, l.id)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ""
		case errors.Is(err, ErrLeaseNotFound):
			return "lease expired in the store"
		case errors.Is(err, ErrStoreRewound):
			return reasonRewound
		case err != nil:
			c.storeFailed("renew", err)
			next = c.now().Add(retryAfter)
		default:
			c.trouble.succeeded(c.log())
			c.lastContact.Store(time.Now().UnixNano())
			l.extend(sent, granted, safetyMargin(granted))
			next = sent.Add(interval)
		}
	}
}

// troubleLog logs the store going away and coming back, not every failed retry: at most
// one WARN every 30s, even when one kind of request keeps failing between successes of
// another (a campaign denied while renewals go through), and one INFO when requests
// succeed again after a logged failure.
type troubleLog struct {
	mu       sync.Mutex
	failing  bool
	warned   bool // a WARN was logged since the last success
	failures int
	lastLog  time.Time
}

const troubleRepeat = 30 * time.Second

func (t *troubleLog) failed(l *zap.Logger, op string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failures++
	t.failing = true
	if t.lastLog.IsZero() || time.Since(t.lastLog) >= troubleRepeat {
		l.Warn("etcd request failing; gated routes fail closed while the lease is not confirmed",
			zap.String("op", op), zap.Int("failures", t.failures), zap.Error(err))
		t.lastLog = time.Now()
		t.warned = true
	}
}

func (t *troubleLog) succeeded(l *zap.Logger) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failing && t.warned {
		l.Info("etcd reachable again", zap.Int("failed_requests", t.failures))
	}
	t.failing, t.warned, t.failures = false, false, 0
}

// forever is a hold-off that outlasts any process.
const forever = 100 * 365 * 24 * time.Hour
