// Package electortest holds an in-memory elector.Backend whose leases expire on an injected
// clock, and the conformance suite (Run) that every store must pass.
package electortest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/jobs"
)

// Store is an in-memory coordination store with etcd's model: one revision counter for every
// write, leases that expire on the store's own clock, keys bound to leases. Each Client of a
// Store plays one candidate's connection. Time moves only when Advance is called, so a test
// decides exactly when a lease runs out.
type Store struct {
	mu      sync.Mutex
	now     time.Time // the store's clock; carries a monotonic reading
	rev     int64
	leases  map[elector.LeaseID]leaseState
	keys    map[string]*key // election -> current holder
	history map[string][]elector.Observation
	intents map[string]intent
	// intentRev counts the changes of each election's intent, so that a watch can tell
	// an intent set again from one it has reported.
	intentRev map[string]int64
	cands     map[string]map[string]candidate // election -> id -> entry
	// candRev counts the changes of each election's candidates, for their watches.
	candRev  map[string]int64
	acks     map[string]map[int64]ack // election -> token -> acknowledgement
	terms    map[string][][]byte      // election -> ended terms, oldest first
	lastTerm map[string]int64         // election -> token of its newest term
	jobs     map[string][]byte        // election + "\x00" + job -> record (jobs.Store)
	down     error
	changed  chan struct{} // closed and replaced on every write
	// keyChanged holds, for an election a key watch waits on, a channel closed (and
	// dropped) when that election's key is next written: a write wakes the watches of its
	// own key, not every watch of a set's thousands.
	keyChanged map[string]chan struct{}
	// broken is closed and replaced when watches in progress must break (the store or a
	// client cut off, a client closed).
	broken  chan struct{}
	clients []*Client // every client made, for Calls
}

type key struct {
	value []byte
	lease elector.LeaseID
	token int64
	rev   int64 // the revision of its last write
}

type leaseState struct {
	ttl     time.Duration
	expires time.Time
}

type intent struct {
	value   []byte
	expires time.Time
}

// NewStore returns an empty store whose clock starts at the real time now.
func NewStore() *Store {
	return &Store{
		now:        time.Now(),
		leases:     make(map[elector.LeaseID]leaseState),
		intentRev:  make(map[string]int64),
		keys:       make(map[string]*key),
		history:    make(map[string][]elector.Observation),
		intents:    make(map[string]intent),
		cands:      make(map[string]map[string]candidate),
		candRev:    make(map[string]int64),
		acks:       make(map[string]map[int64]ack),
		terms:      make(map[string][][]byte),
		lastTerm:   make(map[string]int64),
		jobs:       make(map[string][]byte),
		changed:    make(chan struct{}),
		keyChanged: make(map[string]chan struct{}),
		broken:     make(chan struct{}),
	}
}

// Now reads the store's clock. Give it to elector.Config.Now so that the candidates' lease
// deadlines move with the store's.
func (s *Store) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

// Advance moves the clock forward by d and expires every lease and intent whose time is up,
// as a real store would have meanwhile.
func (s *Store) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = s.now.Add(d)
	s.expireLocked()
}

// RunClock moves the store's clock forward at about real speed, in steps of step, until the
// test ends: for a test that wants time to pass as it would, the first winner of an election
// included (it waits a ttl, see elector's settle.go). The function it returns stops the
// clock sooner.
func (s *Store) RunClock(t testing.TB, step time.Duration) (stopNow func()) {
	stop := make(chan struct{})
	done := make(chan struct{})
	var once sync.Once
	stopNow = func() { once.Do(func() { close(stop); <-done }) }
	t.Cleanup(stopNow)
	go func() {
		defer close(done)
		tick := time.NewTicker(step)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				s.Advance(step)
			}
		}
	}()
	return stopNow
}

// SetDown makes every request of every client fail with err (a store cut off from all its
// clients), or work again when err is nil. Watches in progress break.
func (s *Store) SetDown(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = err
	s.breakWatchesLocked()
}

// Delete removes the election's key as an operator would, whoever holds it.
func (s *Store) Delete(election string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteLocked(election)
}

// Expire ends a lease at once, as if it had run out.
func (s *Store) Expire(id elector.LeaseID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLeaseLocked(id)
}

// Client returns a new connection to the store, as one candidate has.
func (s *Store) Client() *Client {
	c := &Client{s: s}
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c
}

// Claimed is how many elections the clients of s claimed so far, each claim alone or in a
// batch counted once: Calls counts a batch as one CampaignAll.
func (s *Store) Claimed() int64 {
	s.mu.Lock()
	clients := s.clients
	s.mu.Unlock()
	var n int64
	for _, c := range clients {
		c.mu.Lock()
		n += c.claimed
		c.mu.Unlock()
	}
	return n
}

// Calls is how many times each method was called so far on all the clients of s, by
// method name (see Client.Calls).
func (s *Store) Calls() map[string]int64 {
	s.mu.Lock()
	clients := s.clients
	s.mu.Unlock()
	out := make(map[string]int64)
	for _, c := range clients {
		for op, n := range c.Calls() {
			out[op] += n
		}
	}
	return out
}

func (s *Store) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// breakWatchesLocked wakes every watch, its key's or not, to find out that it must end.
func (s *Store) breakWatchesLocked() {
	close(s.broken)
	s.broken = make(chan struct{})
	s.wakeLocked()
}

// keyChangedLocked is a channel closed when election's key is next written.
func (s *Store) keyChangedLocked(election string) <-chan struct{} {
	ch, ok := s.keyChanged[election]
	if !ok {
		ch = make(chan struct{})
		s.keyChanged[election] = ch
	}
	return ch
}

func (s *Store) writeLocked(election string, h *elector.Holder) {
	s.rev++
	if k, ok := s.keys[election]; ok && h != nil {
		k.rev = s.rev
	}
	s.history[election] = append(s.history[election], elector.Observation{Revision: s.rev, Holder: h})
	if ch, ok := s.keyChanged[election]; ok {
		close(ch)
		delete(s.keyChanged, election)
	}
	s.wakeLocked()
}

func (s *Store) deleteLocked(election string) {
	if _, ok := s.keys[election]; !ok {
		return
	}
	delete(s.keys, election)
	s.writeLocked(election, nil)
}

func (s *Store) expireLocked() {
	var gone []elector.LeaseID
	for id, l := range s.leases {
		if !s.now.Before(l.expires) {
			gone = append(gone, id)
		}
	}
	sort.Slice(gone, func(i, j int) bool { return gone[i] < gone[j] })
	for _, id := range gone {
		s.dropLeaseLocked(id)
	}
	for election, in := range s.intents {
		if !s.now.Before(in.expires) {
			s.clearIntentLocked(election)
		}
	}
}

// dropLeaseLocked deletes a lease and everything bound to it.
func (s *Store) dropLeaseLocked(id elector.LeaseID) {
	if _, ok := s.leases[id]; !ok {
		return
	}
	delete(s.leases, id)
	names := make([]string, 0, len(s.keys))
	for election, k := range s.keys {
		if k.lease == id {
			names = append(names, election)
		}
	}
	sort.Strings(names)
	for _, election := range names {
		s.deleteLocked(election)
	}
	for election, ids := range s.cands {
		for cid, c := range ids {
			if c.lease == id {
				delete(ids, cid)
				s.candRev[election]++
			}
		}
	}
	s.wakeLocked()
}

// lock takes the store's lock for one request, failing it if ctx is done or the store is
// down. On success the caller unlocks.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.down != nil {
		err := s.down
		s.mu.Unlock()
		return err
	}
	s.expireLocked()
	return nil
}

func (s *Store) observationLocked(election string) elector.Observation {
	o := elector.Observation{Revision: s.rev}
	if k, ok := s.keys[election]; ok {
		o.Holder = &elector.Holder{Value: clone(k.value), Lease: k.lease, Token: k.token}
	}
	return o
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// Client is one connection to a Store; it implements elector.Backend.
type Client struct {
	s      *Store
	mu     sync.Mutex
	closed bool
	down   error
	fail   map[string]opFailure // method name -> how its calls fail
	lose   map[string]opFailure // method name -> how its calls are applied but answer an error
	delay  time.Duration        // added before every request and every watch event
	// claimsLate is how long after applying them the answers to Campaign and CampaignAll
	// take to come back (see AnswerClaimsLate).
	claimsLate time.Duration
	claimed    int64            // elections claimed, alone or in a batch (see Claimed)
	calls      map[string]int64 // method name -> how many times it was called
	// beforeIntent runs once, before the next intent this client writes is applied.
	beforeIntent func()
}

// BeforeNextIntent makes f run right before the next intent this client writes
// (SetIntent, CreateIntent) is applied: another instance's request landing between this
// one's read of the intent and its write.
func (c *Client) BeforeNextIntent(f func()) {
	c.mu.Lock()
	c.beforeIntent = f
	c.mu.Unlock()
}

// intentWritten runs the hook of BeforeNextIntent, if one is set.
func (c *Client) intentWritten() {
	c.mu.Lock()
	f := c.beforeIntent
	c.beforeIntent = nil
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// SetDelay makes every request of this client, and every change its watches report, reach
// it d late: a candidate behind a slow link, which hears of a change after the others.
func (c *Client) SetDelay(d time.Duration) {
	c.mu.Lock()
	c.delay = d
	c.mu.Unlock()
}

// lag sleeps for the client's delay, or until ctx ends.
func (c *Client) lag(ctx context.Context) {
	c.mu.Lock()
	d := c.delay
	c.mu.Unlock()
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// CandidateReads is how many times Candidates was called on c: how often its candidate
// read the registry rather than its view of it.
func (c *Client) CandidateReads() int64 { return c.Calls()["Candidates"] }

// count counts one call of method op, whether or not it reaches the store. A watch counts
// once, when it is opened: a real store serves it as one stream.
func (c *Client) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = make(map[string]int64)
	}
	c.calls[op]++
}

// Calls is how many times each method of c was called so far, by method name: what a
// candidate asks of the store, for tests and benchmarks that measure it.
func (c *Client) Calls() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.calls))
	for op, n := range c.calls {
		out[op] = n
	}
	return out
}

// opFailure makes the next n calls of one method fail with err (every call while n < 0).
type opFailure struct {
	n   int
	err error
}

// Fail makes the next n calls of method op (its name, such as "Release" or "Update") fail
// with err, without reaching the store, while every other request works: a request lost on
// its way, or a store that refuses one kind of write (a full disk refuses writes, not lease
// renewals). n < 0 fails every call until Fail(op, 0, nil).
func (c *Client) Fail(op string, n int, err error) { c.set(&c.fail, op, n, err) }

// LoseAnswer makes the next n calls of method op (Campaign or AppendHistory) reach the
// store and be applied, then answer err: a timeout after the commit, or a connection reset
// before the reply. n < 0 loses every answer until LoseAnswer(op, 0, nil).
func (c *Client) LoseAnswer(op string, n int, err error) { c.set(&c.lose, op, n, err) }

// AnswerClaimsLate makes every Campaign, and every batch of CampaignAll as a whole, answer
// d after the store applied it: a store busy with other writes, where a request waits its
// turn to be applied and its answer its turn to be sent. A caller whose context ends
// meanwhile gets its context's error, as from a real client: the claim was applied, and
// its answer is lost.
func (c *Client) AnswerClaimsLate(d time.Duration) {
	c.mu.Lock()
	c.claimsLate = d
	c.mu.Unlock()
}

// answerLate waits out AnswerClaimsLate's delay; it returns ctx's error if ctx ends first.
func (c *Client) answerLate(ctx context.Context) error {
	c.mu.Lock()
	d := c.claimsLate
	c.mu.Unlock()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// set makes the next n calls of op get err, as *m counts them.
func (c *Client) set(m *map[string]opFailure, op string, n int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if *m == nil {
		*m = make(map[string]opFailure)
	}
	(*m)[op] = opFailure{n: n, err: err}
}

// failing reports the error the next call of op fails with, if it does.
func (c *Client) failing(op string) error { return c.take(&c.fail, op) }

// losing reports the error the next call of op answers once applied, if it does.
func (c *Client) losing(op string) error { return c.take(&c.lose, op) }

// take counts one call of op against *m and returns the error it gets, if any. It reads
// *m under the lock: set makes the map on the first Fail or LoseAnswer, while requests
// and watches run.
func (c *Client) take(m *map[string]opFailure, op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := (*m)[op]
	if !ok || f.n == 0 {
		return nil
	}
	if f.n > 0 {
		f.n--
		(*m)[op] = f
	}
	return f.err
}

// Restore puts the election's key back as h, as a store failover that lost the writes
// since h was written would. It fails if h's lease is gone.
func (s *Store) Restore(election string, h elector.Holder) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, alive := s.leases[h.Lease]; !alive {
		return elector.ErrLeaseNotFound
	}
	s.keys[election] = &key{value: clone(h.Value), lease: h.Lease, token: h.Token}
	s.writeLocked(election, &elector.Holder{Value: clone(h.Value), Lease: h.Lease, Token: h.Token})
	return nil
}

// SetDown makes every request of this client fail with err (this candidate cut off from the
// store), or work again when err is nil. Watches in progress break.
func (c *Client) SetDown(err error) {
	c.mu.Lock()
	c.down = err
	c.mu.Unlock()
	c.s.mu.Lock()
	c.s.breakWatchesLocked()
	c.s.mu.Unlock()
}

// ErrClosed is returned by requests on a closed Client.
var ErrClosed = errors.New("electortest: client closed")

func (c *Client) lock(ctx context.Context) error {
	c.lag(ctx)
	c.mu.Lock()
	closed, down := c.closed, c.down
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if down != nil {
		return down
	}
	return c.s.lock(ctx)
}

// Grant implements elector.Backend; it grants exactly ttl.
func (c *Client) Grant(ctx context.Context, ttl time.Duration) (elector.LeaseID, time.Duration, error) {
	c.count("Grant")
	if err := c.lock(ctx); err != nil {
		return 0, 0, err
	}
	defer c.s.mu.Unlock()
	id := elector.LeaseID(leaseIDs.Add(1))
	c.s.leases[id] = leaseState{ttl: ttl, expires: c.s.now.Add(ttl)}
	return id, ttl, nil
}

// leaseIDs numbers the leases of every Store in the process. The elector keeps the leases
// of all the candidates of a process in one table (a reload's old and new candidacies
// share an instance id), so stores of tests that run side by side must not hand out the
// same id, any more than two real clusters would.
var leaseIDs atomic.Int64

// Renew implements elector.Backend. The lease keeps the ttl it was granted with.
func (c *Client) Renew(ctx context.Context, id elector.LeaseID) (time.Duration, error) {
	c.count("Renew")
	if err := c.lock(ctx); err != nil {
		return 0, err
	}
	defer c.s.mu.Unlock()
	l, ok := c.s.leases[id]
	if !ok {
		return 0, elector.ErrLeaseNotFound
	}
	l.expires = c.s.now.Add(l.ttl)
	c.s.leases[id] = l
	return l.ttl, nil
}

// Revoke implements elector.Backend.
func (c *Client) Revoke(ctx context.Context, id elector.LeaseID) error {
	c.count("Revoke")
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.s.mu.Unlock()
	c.s.dropLeaseLocked(id)
	return nil
}

// Campaign implements elector.Backend.
func (c *Client) Campaign(ctx context.Context, election string, value []byte, lease elector.LeaseID) (elector.Observation, error) {
	c.count("Campaign")
	o, err := c.campaign(ctx, election, value, lease)
	if lateErr := c.answerLate(ctx); err == nil && lateErr != nil {
		return elector.Observation{}, lateErr
	}
	return o, err
}

// campaign is Campaign, uncounted as a call (see BatchingClient), counted as a claim.
func (c *Client) campaign(ctx context.Context, election string, value []byte, lease elector.LeaseID) (elector.Observation, error) {
	c.mu.Lock()
	c.claimed++
	c.mu.Unlock()
	if err := c.lock(ctx); err != nil {
		return elector.Observation{}, err
	}
	defer c.s.mu.Unlock()
	if _, ok := c.s.keys[election]; !ok {
		if _, alive := c.s.leases[lease]; !alive {
			return elector.Observation{}, elector.ErrLeaseNotFound
		}
		k := &key{value: clone(value), lease: lease, token: c.s.rev + 1}
		c.s.keys[election] = k
		c.s.writeLocked(election, &elector.Holder{Value: clone(value), Lease: lease, Token: k.token})
		o := c.s.observationLocked(election)
		o.Prev, c.s.lastTerm[election] = c.s.lastTerm[election], k.token
		if a, ok := c.s.acks[election][o.Prev]; ok && c.s.now.Before(a.expires) {
			o.PrevReleased, o.PrevWhy = true, a.why
		}
		if err := c.losing("Campaign"); err != nil {
			return elector.Observation{}, err
		}
		return o, nil
	}
	return c.s.observationLocked(election), nil
}

// Observe implements elector.Backend.
func (c *Client) Observe(ctx context.Context, election string) (elector.Observation, error) {
	c.count("Observe")
	return c.observe(ctx, election)
}

// observe is Observe, uncounted.
func (c *Client) observe(ctx context.Context, election string) (elector.Observation, error) {
	if err := c.lock(ctx); err != nil {
		return elector.Observation{}, err
	}
	defer c.s.mu.Unlock()
	return c.s.observationLocked(election), nil
}

// Watch implements elector.Backend.
func (c *Client) Watch(ctx context.Context, election string, afterRev int64) <-chan elector.Observation {
	return c.watch(ctx, election, afterRev, func() {})
}

// WatchWaking implements elector.WakingWatcher.
func (c *Client) WatchWaking(ctx context.Context, election string, seen elector.Observation, wake func()) <-chan elector.Observation {
	return c.watch(ctx, election, seen.Revision, wake)
}

// watch is Watch, calling wake after each observation sent and when the watch closes.
func (c *Client) watch(ctx context.Context, election string, afterRev int64, wake func()) <-chan elector.Observation {
	c.count("Watch")
	out := make(chan elector.Observation, 1)
	go func() {
		defer func() {
			close(out)
			wake()
		}()
		if err := c.failing("Watch"); err != nil {
			out <- elector.Observation{Err: err}
			return
		}
		for {
			if err := c.lock(ctx); err != nil {
				if ctx.Err() == nil {
					select {
					case out <- elector.Observation{Err: err}:
					case <-ctx.Done():
					}
				}
				return
			}
			history := c.s.history[election]
			newer := sort.Search(len(history), func(i int) bool { return history[i].Revision > afterRev })
			pending := slices.Clone(history[newer:])
			changed, broken := c.s.keyChangedLocked(election), c.s.broken
			c.s.mu.Unlock()
			if len(pending) > 0 {
				c.lag(ctx) // the changes travel together, each as late as the link
			}
			for _, o := range pending {
				select {
				case out <- o:
					afterRev = o.Revision
					wake()
				case <-ctx.Done():
					return
				}
			}
			if len(pending) == 0 {
				select {
				case <-changed:
				case <-broken:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// Update implements elector.Backend.
func (c *Client) Update(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	c.count("Update")
	return c.update(ctx, election, token, value)
}

// update is Update, uncounted: a batch of them counts as one call.
func (c *Client) update(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	if err := c.failing("Update"); err != nil {
		return false, err
	}
	if err := c.lock(ctx); err != nil {
		return false, err
	}
	defer c.s.mu.Unlock()
	k, ok := c.s.keys[election]
	if !ok || k.token != token {
		return false, nil
	}
	k.value = clone(value)
	c.s.writeLocked(election, &elector.Holder{Value: clone(value), Lease: k.lease, Token: k.token})
	return true, nil
}

// Acknowledge implements elector.Backend.
func (c *Client) Acknowledge(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	c.count("Acknowledge")
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.s.mu.Unlock()
	c.s.ackLocked(election, token, lease, why)
	return nil
}

// ack is the acknowledgement of a term's end: why it ended, and when the acknowledgement
// expires.
type ack struct {
	why     string
	expires time.Time
}

// ackLocked records the acknowledgement of term token. It outlives the holder's lease (the
// holder may revoke it right after) and expires after the lease's TTL, a minute if the
// lease is unknown.
func (s *Store) ackLocked(election string, token int64, lease elector.LeaseID, why string) {
	ttl := time.Minute
	if l, ok := s.leases[lease]; ok {
		ttl = l.ttl
	}
	if s.acks[election] == nil {
		s.acks[election] = make(map[int64]ack)
	}
	s.acks[election][token] = ack{why: why, expires: s.now.Add(ttl)}
	s.rev++
	s.wakeLocked()
}

// Released implements elector.Backend.
func (c *Client) Released(ctx context.Context, election string, token int64, lease elector.LeaseID) (bool, string, error) {
	c.count("Released")
	if err := c.lock(ctx); err != nil {
		return false, "", err
	}
	defer c.s.mu.Unlock()
	if a, ok := c.s.acks[election][token]; ok {
		delete(c.s.acks[election], token) // consumed
		if c.s.now.Before(a.expires) {
			return true, a.why, nil
		}
	}
	if lease == 0 {
		return false, "", nil
	}
	_, alive := c.s.leases[lease]
	return !alive, "", nil
}

// Expire implements elector.Backend.
func (c *Client) Expire(ctx context.Context, election string, token, rev int64) (bool, error) {
	c.count("Expire")
	return c.expire(ctx, election, token, rev)
}

// expire is Expire, uncounted (see BatchingClient).
func (c *Client) expire(ctx context.Context, election string, token, rev int64) (bool, error) {
	if err := c.lock(ctx); err != nil {
		return false, err
	}
	defer c.s.mu.Unlock()
	if k, ok := c.s.keys[election]; !ok || k.token != token || k.rev > rev {
		return false, nil
	}
	c.s.deleteLocked(election)
	return true, nil
}

// Release implements elector.Backend.
func (c *Client) Release(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	c.count("Release")
	return c.release(ctx, election, token, lease, why)
}

// release is Release, uncounted (see BatchingClient).
func (c *Client) release(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	if err := c.failing("Release"); err != nil {
		return err
	}
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.s.mu.Unlock()
	c.s.ackLocked(election, token, lease, why)
	if k, ok := c.s.keys[election]; ok && k.token == token {
		c.s.deleteLocked(election)
	}
	return nil
}

// Announce implements elector.Backend.
func (c *Client) Announce(ctx context.Context, election, id string, value []byte, lease elector.LeaseID) error {
	c.count("Announce")
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.s.mu.Unlock()
	if _, alive := c.s.leases[lease]; !alive {
		return elector.ErrLeaseNotFound
	}
	if c.s.cands[election] == nil {
		c.s.cands[election] = make(map[string]candidate)
	}
	c.s.cands[election][id] = candidate{lease: lease, value: clone(value)}
	c.s.candRev[election]++
	c.s.rev++
	c.s.wakeLocked()
	return nil
}

// Candidates implements elector.Backend.
func (c *Client) Candidates(ctx context.Context, election string) ([]elector.CandidateEntry, error) {
	c.count("Candidates")
	if err := c.failing("Candidates"); err != nil {
		return nil, err
	}
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.s.mu.Unlock()
	return c.s.candidatesLocked(election), nil
}

func (s *Store) candidatesLocked(election string) []elector.CandidateEntry {
	list := make([]elector.CandidateEntry, 0, len(s.cands[election]))
	for id, cand := range s.cands[election] {
		list = append(list, elector.CandidateEntry{ID: id, Value: clone(cand.value)})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
	return list
}

// WatchCandidates implements elector.Backend. Like WatchIntent it reports the list
// whenever it changed, so two quick changes may show only as the later one.
func (c *Client) WatchCandidates(ctx context.Context, election string) <-chan elector.CandidatesChange {
	c.count("WatchCandidates")
	return watchState(ctx, c, func() (elector.CandidatesChange, int64) {
		return elector.CandidatesChange{Candidates: c.s.candidatesLocked(election)}, c.s.candRev[election]
	}, func(err error) elector.CandidatesChange { return elector.CandidatesChange{Err: err} })
}

// watchState reports the state read returns (under the store's lock) whenever the version
// it returns with it changed since the last report, until ctx ends or the client cannot
// reach the store (broken(the error) is then reported last).
func watchState[T any](ctx context.Context, c *Client, read func() (T, int64), broken func(error) T) <-chan T {
	out := make(chan T, 1)
	go func() {
		defer close(out)
		var seen int64 = -1
		for {
			if err := c.lock(ctx); err != nil {
				if ctx.Err() == nil {
					select {
					case out <- broken(err):
					case <-ctx.Done():
					}
				}
				return
			}
			state, version := read()
			wake := c.s.changed
			c.s.mu.Unlock()
			if version != seen {
				select {
				case out <- state:
					seen = version
				case <-ctx.Done():
					return
				}
				continue
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// candidate is one announced candidate of an election.
type candidate struct {
	lease elector.LeaseID
	value []byte
}

// AppendHistory implements elector.Backend.
func (c *Client) AppendHistory(ctx context.Context, election string, entry []byte, keep int) error {
	c.count("AppendHistory")
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.s.mu.Unlock()
	if err := c.failing("AppendHistory"); err != nil {
		return err
	}
	list := append(c.s.terms[election], clone(entry))
	c.s.terms[election] = list[max(0, len(list)-keep):]
	c.s.rev++
	return c.losing("AppendHistory")
}

// History implements elector.Backend.
func (c *Client) History(ctx context.Context, election string) ([][]byte, error) {
	c.count("History")
	return c.history(ctx, election)
}

// history is History, uncounted.
func (c *Client) history(ctx context.Context, election string) ([][]byte, error) {
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.s.mu.Unlock()
	list := make([][]byte, 0, len(c.s.terms[election]))
	for _, e := range c.s.terms[election] {
		list = append(list, clone(e))
	}
	return list, nil
}

// SetIntent implements elector.Backend.
func (c *Client) SetIntent(ctx context.Context, election string, value []byte, ttl time.Duration) error {
	c.count("SetIntent")
	c.intentWritten()
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.s.mu.Unlock()
	c.s.setIntentLocked(election, value, ttl)
	return nil
}

func (s *Store) setIntentLocked(election string, value []byte, ttl time.Duration) {
	s.intents[election] = intent{value: clone(value), expires: s.now.Add(ttl)}
	s.intentRev[election]++
	s.rev++
	s.wakeLocked()
}

// CreateIntent implements elector.IntentCreator.
func (c *Client) CreateIntent(ctx context.Context, election string, value []byte, ttl time.Duration) (bool, error) {
	c.count("CreateIntent")
	c.intentWritten()
	if err := c.lock(ctx); err != nil {
		return false, err
	}
	defer c.s.mu.Unlock()
	if pending, ok := c.s.intents[election]; ok && c.s.now.Before(pending.expires) {
		return false, nil
	}
	c.s.setIntentLocked(election, value, ttl)
	return true, nil
}

// ClearIntent implements elector.Backend.
func (c *Client) ClearIntent(ctx context.Context, election string, value []byte) error {
	c.count("ClearIntent")
	if err := c.lock(ctx); err != nil {
		return err
	}
	defer c.s.mu.Unlock()
	if in, ok := c.s.intents[election]; ok && (value == nil || bytes.Equal(in.value, value)) {
		c.s.clearIntentLocked(election)
	}
	return nil
}

func (s *Store) clearIntentLocked(election string) {
	if _, ok := s.intents[election]; ok {
		delete(s.intents, election)
		s.intentRev[election]++
		s.rev++
		s.wakeLocked()
	}
}

// WatchIntent implements elector.Backend. Like a watch on a real store it reports the
// intent whenever it changed, so two quick changes may show only as the later one; an
// intent set again to the same value is reported again.
func (c *Client) WatchIntent(ctx context.Context, election string) <-chan elector.IntentChange {
	c.count("WatchIntent")
	return watchState(ctx, c, func() (elector.IntentChange, int64) {
		ch := elector.IntentChange{}
		if in, ok := c.s.intents[election]; ok {
			ch.Value = clone(in.value)
		}
		return ch, c.s.intentRev[election]
	}, func(err error) elector.IntentChange { return elector.IntentChange{Err: err} })
}

// WatchGroupIntents implements elector.IntentGrouper: every report lists the group's
// intents whole, whenever one of them changed.
func (c *Client) WatchGroupIntents(ctx context.Context, group string) <-chan elector.GroupIntents {
	c.count("WatchGroupIntents")
	prefix := group + "."
	return watchState(ctx, c, func() (elector.GroupIntents, int64) {
		rep := elector.GroupIntents{All: true, Intents: map[string][]byte{}}
		var version int64
		for election, rev := range c.s.intentRev {
			if strings.HasPrefix(election, prefix) {
				version += rev
			}
		}
		for election, in := range c.s.intents {
			if strings.HasPrefix(election, prefix) {
				rep.Intents[election] = clone(in.value)
			}
		}
		return rep, version
	}, func(err error) elector.GroupIntents { return elector.GroupIntents{Err: err} })
}

// Close implements elector.Backend. Its watches end.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.s.mu.Lock()
	c.s.breakWatchesLocked()
	c.s.mu.Unlock()
	return nil
}

var (
	_ elector.Backend       = (*Client)(nil)
	_ elector.IntentGrouper = (*Client)(nil)
	_ elector.WakingWatcher = (*Client)(nil)
	_ elector.IntentCreator = (*Client)(nil)
)

// JobRecord implements jobs.Store.
func (c *Client) JobRecord(ctx context.Context, election, job string) ([]byte, error) {
	c.count("JobRecord")
	if err := c.failing("JobRecord"); err != nil {
		return nil, err
	}
	if err := c.lock(ctx); err != nil {
		return nil, err
	}
	defer c.s.mu.Unlock()
	return clone(c.s.jobs[election+"\x00"+job]), nil
}

// PutJobRecord implements jobs.Store: the record is written only while election's key is
// held under token.
func (c *Client) PutJobRecord(ctx context.Context, election, job string, token int64, value []byte) (bool, error) {
	c.count("PutJobRecord")
	if err := c.failing("PutJobRecord"); err != nil {
		return false, err
	}
	if err := c.lock(ctx); err != nil {
		return false, err
	}
	defer c.s.mu.Unlock()
	if k, ok := c.s.keys[election]; !ok || k.token != token {
		return false, nil
	}
	c.s.rev++
	c.s.jobs[election+"\x00"+job] = clone(value)
	if err := c.losing("PutJobRecord"); err != nil {
		return false, err
	}
	return true, nil
}

var _ jobs.Store = (*Client)(nil)
