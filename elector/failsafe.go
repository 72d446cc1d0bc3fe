package elector

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Failsafe mode lets a leader ride out an outage of the store, as Patroni's failsafe_mode
// does: while the store cannot be reached (a transport error or a timeout, never a lost
// compare, a lease the store no longer knows or a rewind), the leader keeps admitting for
// as long as every member of its roster confirms, every renewal interval, that it does not
// lead itself and will neither campaign nor confirm another term for a TTL. The argument is
// in docs/safety.md; in short:
//
//   - The roster (every live candidate, with the URL of its failsafe endpoint) is kept in
//     the store by the leader, in a key bound to no lease (the election's failsafe roster),
//     and counts only once a heartbeat sent after writing it succeeded. A winner not in the
//     newest roster admits only once a roster member promised to confirm no older term and
//     the member's last confirmation has run out (see proveNoFailsafe).
//   - A round is sent at s; the leader admits until s + ttl - margin only if every member
//     accepted; a member that accepts at r >= s keeps the term alive until r + ttl.
//   - Messages are authenticated with the term's MarkKey, which only readers of the store
//     know.

// ErrUnreachable is what a Backend wraps in an error that means the store could not be
// reached in time (a transport error or a timeout), as opposed to an answer it gave. Only
// such errors start a failsafe.
var ErrUnreachable = errors.New("the store cannot be reached")

// UnreachableClassifier is implemented by a Backend that can tell, from an error of its
// own, that the store could not be reached (connection refused, no leader, deadline). The
// elector asks it about errors that do not wrap ErrUnreachable.
type UnreachableClassifier interface {
	Unreachable(err error) bool
}

// Unreachable reports whether err, returned by b, means that the store could not be
// reached (see ErrUnreachable): a request whose deadline passed counts too. A lease not
// found and a rewound store never do.
func Unreachable(b Backend, err error) bool {
	switch {
	case err == nil, errors.Is(err, ErrLeaseNotFound), errors.Is(err, ErrStoreRewound):
		return false
	case errors.Is(err, ErrUnreachable), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	if u, ok := b.(UnreachableClassifier); ok {
		return u.Unreachable(err)
	}
	return false
}

// FailsafeTransport carries failsafe messages between instances.
type FailsafeTransport interface {
	// Ask sends body to the failsafe endpoint at url and returns the answer's body. It
	// returns no later than ctx's deadline.
	Ask(ctx context.Context, url string, body []byte) ([]byte, error)
}

// FailsafeConfig turns failsafe mode on for a candidate.
type FailsafeConfig struct {
	// URL is where the other instances reach this one's failsafe endpoint (which passes
	// what it receives to Candidate.FailsafeAnswer).
	URL string
	// Timeout bounds each question to a peer. Zero means TTL/4.
	Timeout time.Duration
	// Transport sends this instance's questions.
	Transport FailsafeTransport
}

func checkFailsafe(cfg Config) error {
	f := cfg.Failsafe
	switch {
	case f == nil:
		return nil
	case f.URL == "":
		return errors.New("elector: failsafe needs the URL peers reach this instance at")
	case f.Transport == nil:
		return errors.New("elector: failsafe needs a transport")
	case f.Timeout < 0 || f.Timeout >= cfg.TTL/3:
		return fmt.Errorf("elector: failsafe timeout %s must be positive and below a third of the ttl (%s)", f.Timeout, cfg.TTL/3)
	}
	return nil
}

// failsafeTimeout is how long a question to a peer may take.
func (c *Candidate) failsafeTimeout() time.Duration {
	if f := c.cfg.Failsafe; f != nil && f.Timeout > 0 {
		return f.Timeout
	}
	return c.cfg.TTL / 4
}

// fsTransport is how this candidate asks other instances: its failsafe's transport, or
// the one it fences other terms' rosters with (nil if neither is set).
func (c *Candidate) fsTransport() FailsafeTransport {
	if f := c.cfg.Failsafe; f != nil {
		return f.Transport
	}
	return c.cfg.Fence
}

// candidateFailsafe is a candidate's view of the store's reachability for failsafe.
type candidateFailsafe struct {
	mu sync.Mutex
	// cause is why the store is taken for unreachable (the last renewal or heartbeat
	// failed with a transport error, and no renewal succeeded since); "" when it is not.
	cause string
	wake  chan struct{} // closed and replaced when trouble begins
}

// failsafeTrouble notes a failed store request: a renewal or a heartbeat that could not
// reach the store wakes every leader's failsafe loop.
func (c *Candidate) failsafeTrouble(op string, err error) {
	if c.cfg.Failsafe == nil || (op != "renew" && op != "heartbeat") || !Unreachable(c.cfg.Backend, err) {
		return
	}
	c.fs.mu.Lock()
	defer c.fs.mu.Unlock()
	if c.fs.cause == "" {
		c.fs.cause = op + ": " + err.Error()
		if c.fs.wake != nil {
			close(c.fs.wake)
			c.fs.wake = nil
		}
	}
}

// failsafeContact notes a confirmed renewal: the store is reachable.
func (c *Candidate) failsafeContact() {
	c.fs.mu.Lock()
	c.fs.cause = ""
	c.fs.mu.Unlock()
}

// failsafeState returns the current trouble ("" when none) and a channel closed when
// trouble next begins.
func (c *Candidate) failsafeState() (string, <-chan struct{}) {
	c.fs.mu.Lock()
	defer c.fs.mu.Unlock()
	if c.fs.wake == nil {
		c.fs.wake = make(chan struct{})
	}
	return c.fs.cause, c.fs.wake
}

// leaseHorizon is how long the lease loop must keep l: until its deadline, or until the
// failsafe window of a term held under it, whichever is later; zero once both passed.
func (c *Candidate) leaseHorizon(l *lease, now time.Time) time.Duration {
	d := l.remaining(now)
	if c.cfg.Failsafe == nil {
		return d
	}
	for _, e := range c.Elections() {
		if t := e.term.Load(); t.lease == l && t.fs != nil {
			d = max(d, t.fs.remaining(now))
		}
	}
	return d
}

// failsafeOpen reports whether a term whose lease or heartbeat deadline has passed may
// still admit because a failsafe round confirmed it.
func (t *Term) failsafeOpen(now time.Time) bool {
	if t.fs == nil || !t.fs.valid(now) {
		return false
	}
	select {
	case <-t.lease.lost:
		return false
	default:
		return true
	}
}

// beatHorizon is how long t may still admit without a heartbeat reaching the store: until
// its heartbeat deadline, or until its failsafe window if one is open.
func (t *Term) beatHorizon(now time.Time) time.Duration {
	d := t.beat.remaining(now)
	if t.failsafeOpen(now) {
		d = max(d, t.fs.remaining(now))
	}
	return d
}

// Failsafe message kinds.
const (
	// fsConfirm: the leader of a term asks a peer to keep the term alive for a TTL.
	fsConfirm = "confirm"
	// fsEnd: the leader tells a peer that the failsafe of its term is over.
	fsEnd = "end"
	// fsFence: the winner of a newer term asks a member of an older term's roster to
	// confirm that term no more and to say how long its last confirmation still holds.
	fsFence = "fence"
)

// fsMessage is a failsafe question. It is authenticated with the MarkKey of term Token.
type fsMessage struct {
	Kind     string        `json:"kind"`
	Election string        `json:"election"`
	Token    int64         `json:"token"`
	From     string        `json:"from"`
	To       string        `json:"to"`
	NewToken int64         `json:"new_token,omitempty"`
	TTL      time.Duration `json:"ttl,omitempty"`
	// Seq orders the messages of one leader: an end counts only after the confirmation
	// it follows (see Election.answer).
	Seq   int64  `json:"seq,omitempty"`
	At    int64  `json:"at"` // Unix nanoseconds, the sender's wall clock
	Nonce string `json:"nonce"`
	MAC   []byte `json:"mac,omitempty"`
}

// fsReply is a failsafe answer, authenticated with the same key as the question.
type fsReply struct {
	Accepted  bool          `json:"accepted"`
	Reason    string        `json:"reason,omitempty"`
	Remaining time.Duration `json:"remaining,omitempty"`
	MAC       []byte        `json:"mac,omitempty"`
}

func (m *fsMessage) mac(key []byte) []byte {
	return macFields(key, m.Kind, m.Election, strconv.FormatInt(m.Token, 10), m.From, m.To,
		strconv.FormatInt(m.NewToken, 10), strconv.FormatInt(int64(m.TTL), 10), strconv.FormatInt(m.Seq, 10),
		strconv.FormatInt(m.At, 10), m.Nonce)
}

// replyMAC binds a reply to the question it answers (by its nonce) and to the answerer.
func (r *fsReply) mac(key []byte, m *fsMessage) []byte {
	return macFields(key, "reply", m.Nonce, m.To, strconv.FormatBool(r.Accepted), strconv.FormatInt(int64(r.Remaining), 10))
}

// macFields is the HMAC-SHA256 of fields, each length-prefixed so that no two different
// lists run together into the same bytes.
func macFields(key []byte, fields ...string) []byte {
	h := hmac.New(sha256.New, key)
	var n [8]byte
	for _, f := range fields {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

func newNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// ask sends m, signed with key, to url and returns the verified reply; a reply that does
// not verify is an error.
func (c *Candidate) ask(ctx context.Context, url string, key []byte, m fsMessage) (fsReply, error) {
	m.At, m.Nonce = time.Now().UnixNano(), newNonce()
	m.MAC = m.mac(key)
	body, _ := json.Marshal(m) // strings and numbers always marshal
	rctx, cancel := context.WithTimeout(ctx, c.failsafeTimeout())
	defer cancel()
	out, err := c.fsTransport().Ask(rctx, url, body)
	if err != nil {
		return fsReply{}, err
	}
	var r fsReply
	if err := json.Unmarshal(out, &r); err != nil {
		return fsReply{}, fmt.Errorf("failsafe answer from %s: %w", url, err)
	}
	if !hmac.Equal(r.MAC, r.mac(key, &m)) {
		return fsReply{}, fmt.Errorf("failsafe answer from %s not authenticated (%s)", url, r.Reason)
	}
	return r, nil
}

// fsRoster is the roster of a term, as the leader keeps it in the store.
type fsRoster struct {
	Token  int64  `json:"token"`
	Leader string `json:"leader"`
	// LeaderBoot names the leader's process (see CandidateInfo.Boot).
	LeaderBoot string        `json:"leader_boot,omitempty"`
	MarkKey    string        `json:"mark_key"`
	TTL        time.Duration `json:"ttl"`
	Members    []fsMember    `json:"members"`
	// NeedsPeer is set by leaders that ride a failsafe only with another member's
	// confirmation: a roster that lists its leader alone then never carried one. It is
	// unset in rosters of earlier versions, whose leader rode alone.
	NeedsPeer bool `json:"needs_peer,omitempty"`
}

// fsMember is one candidate of a roster.
type fsMember struct {
	ID string `json:"id"`
	// Boot names the member's process: an instance started again under the same id (a
	// new VM with the old hostname, a rescheduled pod) is another member, which the
	// leader never asked.
	Boot string `json:"boot,omitempty"`
	// URL is its failsafe endpoint; empty when it has no failsafe (it cannot confirm).
	URL string `json:"url,omitempty"`
}

// lists reports whether the process boot of instance id is r's leader or one of its
// members: the leader of r asks it, so r's term cannot ride a failsafe past it. A roster
// that names no processes (written by an earlier version) lists nobody.
func (r *fsRoster) lists(id, boot string) bool {
	if boot == "" {
		return false
	}
	if r.Leader == id && r.LeaderBoot == boot {
		return true
	}
	for _, m := range r.Members {
		if m.ID == id && m.Boot == boot {
			return true
		}
	}
	return false
}

// couldRide reports whether the leader of r could ride out a failsafe with it: only if it
// has members to ask, and every one but the leader has a failsafe endpoint (a member
// without one refuses every round). A leader of this version also needs one member other
// than itself (hasPeer); one of an earlier version rode alone.
func (r *fsRoster) couldRide() bool {
	if len(r.Members) == 0 || r.NeedsPeer && !r.hasPeer() {
		return false
	}
	for _, m := range r.Members {
		if m.ID != r.Leader && m.URL == "" {
			return false
		}
	}
	return true
}

// hasPeer reports whether r lists a member other than its leader's id. A leader alone in
// its roster does not ride a failsafe: nobody could fence its term, and a successor under
// its own id (its next process, which asks nobody under that id) would wait for a fence
// that never comes.
func (r *fsRoster) hasPeer() bool {
	for _, m := range r.Members {
		if m.ID != r.Leader {
			return true
		}
	}
	return false
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// rostersKept is how many rosters the store keeps per election: a deposed leader's late
// write cannot hide the newest term's roster, which is picked by token.
const rostersKept = 8

// rosterElection names where an election's rosters are kept: a history bound to no lease.
func rosterElection(election string) string { return election + "/failsafe-roster" }

// latestRoster reads the roster of the newest term from the store; nil when there is none.
func (e *Election) latestRoster(ctx context.Context) (*fsRoster, error) {
	entries, err := e.readHistory(ctx, rosterElection(e.name))
	if err != nil {
		return nil, err
	}
	var best *fsRoster
	for _, b := range entries {
		var r fsRoster
		if json.Unmarshal(b, &r) == nil && r.Token != 0 && (best == nil || r.Token >= best.Token) {
			best = &r
		}
	}
	return best, nil
}

// FailsafeStatus is an election's failsafe state, for the admin API and metrics.
type FailsafeStatus struct {
	// Enabled is set when the candidate runs with failsafe mode.
	Enabled bool `json:"enabled"`
	// Active is set while this instance leads through a failsafe.
	Active bool `json:"active"`
	// Cause is why the failsafe began.
	Cause string `json:"cause,omitempty"`
	// Since is when the failsafe began.
	Since time.Time `json:"since,omitzero"`
	// Roster lists the instances this leader asks (its confirmed roster).
	Roster []string `json:"roster,omitempty"`
	// Rounds counts the rounds of questions sent, and Refused those that some peer
	// refused or did not answer.
	Rounds  int64 `json:"rounds"`
	Refused int64 `json:"refused"`
	// Confirming is the term this instance, as a peer, keeps alive, and ConfirmingFor
	// for how much longer; zero when none.
	Confirming    int64         `json:"confirming,omitempty"`
	ConfirmingFor time.Duration `json:"confirming_for,omitempty"`
}

// FailsafeObserver is an Observer that is also told when a failsafe starts and ends, and
// of each round.
type FailsafeObserver interface {
	Observer
	FailsafeChanged(e *Election, active bool, cause string)
	FailsafeRound(e *Election, refused bool)
}

func (c *Candidate) failsafeObserver() FailsafeObserver {
	o, _ := c.observe().(FailsafeObserver)
	return o
}
