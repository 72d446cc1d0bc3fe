package elector

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"time"
)

// Record is what an election key says about its holder. It is informational: who really holds
// the key is decided by the lease it is bound to.
type Record struct {
	// ID is the holder's instance id.
	ID string `json:"id"`
	// URL is how peers reach the holder (its advertise address); may be empty.
	URL string `json:"url,omitempty"`
	// Since is when the holder's term began, by the holder's wall clock.
	Since time.Time `json:"since"`
	// HandingOver was set by a leader that was about to let go (shutdown, resign), in
	// releases before the handover took one store round trip: peers then stop sending it
	// requests and wait for its successor. It is still honoured when read, so that a
	// fleet can be upgraded one instance at a time; this release never writes it.
	HandingOver bool `json:"handing_over,omitempty"`
	// MarkKey is the secret of this term with which peers authenticate the requests they
	// forward to the holder (see Election.EnterForwarded). It is random per campaign, so
	// it is known only to those who can read the election key in the store, and a mark
	// made for one term is worthless in any other.
	MarkKey string `json:"mark_key,omitempty"`
	// TTL is the TTL the store granted the holder's lease. A successor that takes the key
	// without the holder's acknowledgement derives from it how long the holder may still
	// admit after its last heartbeat (see beatWindow).
	TTL time.Duration `json:"ttl,omitempty"`
}

// newMarkKey returns a fresh random MarkKey.
func newMarkKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (r Record) encode() []byte {
	b, _ := json.Marshal(r) // a struct of strings and a time cannot fail to marshal
	return b
}

func decodeRecord(b []byte) (Record, error) {
	var r Record
	err := json.Unmarshal(b, &r)
	return r, err
}

// recordCodec remembers the last record an election decoded and the last it encoded. A
// shard set's followers see every holder's beacon as its key's value once more, and its
// holders write their record with every heartbeat: thousands of shards each decoding or
// encoding the same JSON every renewal was a fifth of an idle instance's CPU.
type recordCodec struct {
	value   []byte // what was decoded last, as the store gave it
	decoded Record
	rec     Record // what was encoded last
	encoded []byte
}

// decode is decodeRecord, without decoding again the value it decoded last.
func (c *recordCodec) decode(b []byte) (Record, error) {
	if c.value != nil && bytes.Equal(b, c.value) {
		return c.decoded, nil
	}
	r, err := decodeRecord(b)
	if err == nil {
		c.value, c.decoded = bytes.Clone(b), r // a driver may reuse b
	}
	return r, err
}

// encode is r.encode(), without encoding again the record it encoded last. The bytes
// returned are shared: the caller must not change them.
func (c *recordCodec) encode(r Record) []byte {
	if c.encoded == nil || c.rec != r {
		c.rec, c.encoded = r, r.encode()
	}
	return c.encoded
}

// Term is an immutable snapshot of one election as this instance sees it. A new Term is
// published on every change, so readers load one pointer and never see a half-made state.
type Term struct {
	// Election is the election's name.
	Election string
	// Self is this instance's id.
	Self string
	// Leader is the holder of the election key as last observed. Leader.ID is empty when no
	// leader is known (nobody holds the key, or the store cannot be reached).
	Leader Record
	// Token is the fencing token (the key's create revision) of Leader's term; 0 when no
	// leader is known.
	Token int64
	// Draining is set while this instance holds the key but is handing it over: it admits
	// no new gated request and waits for the admitted ones to finish.
	Draining bool
	// Settling is set while this instance has just taken the key but the previous holder
	// has not yet been confirmed to have stopped (see Election): it admits nothing yet.
	Settling bool
	// Releasing is set once this instance has begun to release the key of this term (a
	// handover drained it): it admits nothing, forwarded requests included, and never
	// will again under this term, even if the release fails or its answer is lost.
	Releasing bool
	// Reason says why this snapshot was published ("elected", "key deleted", ...).
	Reason string
	// At is when this snapshot was published, by the local clock.
	At time.Time

	// lease is the lease under which this instance holds the key; nil when it does not.
	lease *lease
	// beat is how long after its last heartbeat this term may admit (see beatWindow);
	// shared by every snapshot of the term. Set whenever lease is.
	beat *deadline
	// fs is how long a failsafe round let this term admit past those deadlines (see
	// failsafe.go); shared like beat. Set whenever lease is.
	fs *deadline
	// proof is what the term owes before it admits, and before its end may vouch for
	// anything (see proof). Set whenever lease is.
	proof *proof
	// end is cancelled when this instance's hold of the key ends; already cancelled
	// for a Term that does not hold it.
	end context.Context
}

// Context is cancelled the moment this instance's term ends: its lease ran out (at the
// deadline, even with the store unreachable), or the key was deleted, taken over or released.
// Work done for the leader can tie itself to it so that it stops when leadership does.
func (t *Term) Context() context.Context { return t.end }

// ended is the Context of every Term that does not hold the key.
var ended = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// Holds reports whether this instance holds the election key (whether or not it may admit).
func (t *Term) Holds() bool { return t.lease != nil }

// Leading reports whether this instance may act as leader at now: it holds the key, the
// term has settled, it is neither draining for a handover nor releasing, and both of its
// deadlines are ahead on both clocks (its lease's, and the one its last heartbeat gave it),
// or a failsafe round keeps it open. This is the check every gated request passes through,
// forwarded ones included.
func (t *Term) Leading(now time.Time) bool {
	return t.lease != nil && !t.Draining && !t.Settling && !t.Releasing &&
		(t.lease.valid(now) && t.beat.valid(now) || t.failsafeOpen(now))
}

// LeaderKnown reports whether some instance (perhaps this one) is known to hold the key.
func (t *Term) LeaderKnown() bool { return t.Leader.ID != "" }

// Settled reports whether requests can go somewhere now: this instance leads, or another
// instance holds the key and is not handing it over. While a term is not settled (no
// leader, a handover under way, this instance's lease lapsed), requests wait for the next.
func (t *Term) Settled(now time.Time) bool {
	if t.lease != nil {
		return t.Leading(now)
	}
	return t.LeaderKnown() && !t.Leader.HandingOver
}
