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
	// Priority ranks this candidate among those free to take a vacant key: higher wins.
	// Zero means DefaultPriority; NeverLead makes a candidate that never campaigns.
	// SetPriority changes it later.
	Priority int
	// Preempt makes this candidate, while healthy, ask a leader of lower priority for a
	// graceful transfer to itself (see priority.go).
	Preempt bool
	// Failsafe, if set, lets a leader ride out an outage of the store while every peer
	// confirms it (see failsafe.go).
	Failsafe *FailsafeConfig
	// Fence, for a candidate without Failsafe, is how it reaches the members of another
	// term's failsafe roster: before a term of its own follows one that did not end
	// provably (a crash, a key that expired), it has one of them promise to confirm that
	// term no more (see proveNoFailsafe), since its leader may still be riding out an
	// outage that this candidate never saw. Nil means no instance of the fleet runs
	// failsafe mode.
	Fence FailsafeTransport
	// Now reads the clock; nil means time.Now. It must return times with a monotonic
	// reading. Tests move it forward to simulate a pause.
	Now func() time.Time
}

// MinTTL is the smallest lease TTL the elector accepts. Stores raise shorter TTLs to what
// their own failure detection needs, and a renewal every TTL/3 must fit in a round trip and a
// disk write, so shorter ones would not mean what they say.
const MinTTL = time.Second

// Candidate is one instance taking part in elections. It holds one lease at a time, shared by
// all its elections (so a fleet costs the store one renewal per instance per TTL/3, however
// many elections there are), and runs one campaign loop per election.
type Candidate struct {
	cfg            Config
	batches        *storeBatches // releases and a set's claims, batched where the store can
	now            func() time.Time
	realClock      bool // now is time.Now: a timer set for a deadline of now's fires at it
	requestTimeout time.Duration
	drainTimeout   atomic.Int64 // a time.Duration; the newest config's
	logger         atomic.Pointer[zap.Logger]
	trouble        troubleLog
	lastContact    atomic.Int64 // Unix nanoseconds of the last successful grant or renewal
	observer       atomic.Pointer[observerBox]
	prio           priority
	fs             candidateFailsafe
	// boot names this process's candidacy, random at every start (see CandidateInfo.Boot).
	boot string
	// exiting is set once Leave or Close began: the lease is about to be revoked, which
	// takes every key with it and leaves no acknowledgement, so a term that cannot
	// complete its proof need not wait for it (see Election.handOver).
	exiting atomic.Bool

	ctx    context.Context // cancelled by Close: ends every loop
	cancel context.CancelFunc

	startOnce sync.Once
	closeOnce sync.Once
	loops     sync.WaitGroup
	appends   atomic.Int64 // history entries on their way to the store

	mu        sync.Mutex
	current   *lease        // the lease in use; nil while there is none
	leaseWake chan struct{} // closed (and replaced) whenever current changes
	abandoned LeaseID       // the last lease given up, whose keys may linger until it expires
	elections map[string]*Election
	moveLogs  map[moveLogKey]*MoveLog // by shard set (see movelog.go)
	// sharedRegistries are the registries of the shard sets, by set (sharedregistry.go).
	sharedRegistries map[string]*sharedRegistry
	closed           bool
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
	if err := checkFailsafe(cfg); err != nil {
		return nil, err
	}
	c := &Candidate{
		cfg:       cfg,
		now:       cfg.Now,
		leaseWake: make(chan struct{}),
		elections: make(map[string]*Election),
		// A renewal that takes longer than a third of the TTL is as good as failed: the
		// next one is due. A second is the floor so a slow disk fsync is not a failure.
		requestTimeout: max(time.Second, cfg.TTL/3),
		boot:           newNonce(),
	}
	c.batches = newStoreBatches(cfg.Backend, c.requestTimeout)
	if c.now == nil {
		c.now, c.realClock = time.Now, true
	}
	c.SetLogger(cfg.Logger)
	c.SetDrainTimeout(cfg.DrainTimeout)
	c.prio.rank.Store(effectivePriority(cfg.Priority))
	c.prio.preempt.Store(cfg.Preempt)
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

// GroupHeartbeats asks the store to carry the heartbeats of the elections named
// group.<anything> in one write per renewal (see HeartbeatGrouper), if it can; call it
// before the first of them starts.
func (c *Candidate) GroupHeartbeats(group string) {
	if g, ok := c.cfg.Backend.(HeartbeatGrouper); ok {
		g.GroupHeartbeats(group)
	}
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
//
// Unlike Resign, it does not wake the campaign loops: each one campaigns no more on its
// next pass, whatever wakes it (the vacancy its own release leaves, a lease lost), and a
// loop that wins a key meanwhile lets go of it there (see run), as Close would. Waking
// every loop would send each election's requests (its registry entry marked leaving, a
// read, a new watch) to the store at the very moment the releases need it: for an
// instance in a shard set, several requests for every shard of the set, against one
// release for each shard it owns. The lease's revoke, which follows, takes the registry
// entries away.
func (c *Candidate) Leave(ctx context.Context) error {
	c.exiting.Store(true)
	var wg sync.WaitGroup
	errs := make(chan error, len(c.Elections()))
	for _, e := range c.Elections() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.handOver(ctx, forever)
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
		c.exiting.Store(true)
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
		// A term that just settled records the one before it; give that write a
		// request's time before the context that carries it ends.
		c.waitAppends(c.requestTimeout)

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

// waitAppends waits until no history entry is on its way to the store, or for d.
func (c *Candidate) waitAppends(d time.Duration) {
	for deadline := time.Now().Add(d); c.appends.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// retryRelease deletes the key of a term of election that this candidate no longer
// follows, retrying until it succeeds, the lease it is bound to is given up (the key then
// goes with it) or the candidate closes (which revokes that lease). If the term's proof
// (pred, when not nil) is not complete yet, it waits for that first: the release
// acknowledges, for why (an Ended* value).
func (c *Candidate) retryRelease(election string, token int64, l *lease, pred *proof, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.loops.Add(1)
	go func() {
		defer c.loops.Done()
		if pred != nil && !pred.wait(c.ctx, c.now) {
			return
		}
		retry := newBackoff(100*time.Millisecond, min(5*time.Second, c.cfg.TTL))
		for {
			select {
			case <-c.ctx.Done():
				return
			case <-l.lost:
				return
			default:
			}
			rctx, cancel := context.WithTimeout(c.ctx, c.requestTimeout)
			err := c.batches.release(rctx, election, token, l.id, why)
			cancel()
			if err == nil || errors.Is(err, ErrLeaseNotFound) {
				c.log().Info("released the key of an election no longer configured",
					zap.String("election", election), zap.Int64("token", token))
				return
			}
			c.storeFailed("release", err)
			if !retry.wait(c.ctx) {
				return
			}
		}
	}()
}

// forever is a hold-off that outlasts any process.
const forever = 100 * 365 * 24 * time.Hour
