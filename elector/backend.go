package elector

import (
	"context"
	"errors"
	"time"
)

// LeaseID names a lease in the coordination store. Zero means "no lease".
type LeaseID int64

// ErrLeaseNotFound is returned by Backend.Renew when the store no longer knows the lease:
// it expired or was revoked, and with it every key bound to it is gone.
var ErrLeaseNotFound = errors.New("lease not found: it expired or was revoked")

// ErrStoreRewound is returned (wrapped) by a Backend call whose answer comes from a store
// state older than one this backend has already seen: the store was restored from a snapshot
// or replaced. Nothing learned before it can be trusted; the elector gives up its lease,
// which stops admission, and campaigns anew.
var ErrStoreRewound = errors.New("the store's revision went backwards (restored from a snapshot?)")

// Holder is the holder of an election key as the store reported it.
type Holder struct {
	// Value is the raw value of the key (an encoded Record).
	Value []byte
	// Lease is the lease the key is bound to. Ownership is decided by the lease, not by the
	// instance id in Value: two processes can claim one id, but never one lease.
	Lease LeaseID
	// Token is the key's create revision. A new term always creates the key anew, so tokens
	// strictly increase from term to term: this is the fencing token.
	Token int64
}

// Observation is the state of an election key at a store revision.
type Observation struct {
	// Revision is the store revision the observation is current as of; a watch that starts
	// after it misses no change.
	Revision int64
	// Holder is nil when nobody holds the key.
	Holder *Holder
	// Prev is set by a Campaign that created the key: the token of the term that held the
	// key last before it, the newest one the election ever had. It is how a new holder knows
	// exactly whose end it must see before it admits, even a term it never saw (its watch
	// was down, or it has just started). Zero when the store cannot tell (no term held the
	// key since the store began keeping track, or the store does not say); the new holder
	// then waits until every term it could not see is certainly over (see settle.go).
	Prev int64
	// PrevReleased is set with Prev when the store found, in the same request, that the
	// holder of term Prev acknowledged its end (as Released would report, and it may
	// consume the acknowledgement as Released does): the new holder may admit at once, one
	// round trip after the release it follows.
	PrevReleased bool
	// PrevWhy is, with PrevReleased, why the holder of term Prev said it stopped: the why
	// of its Acknowledge or Release (see Released). Empty when it gave none (an instance
	// of an older release acknowledged).
	PrevWhy string
	// Err is set (and nothing else) when a watch broke; the watcher must read the key again.
	Err error
}

// Backend is what an election needs from a coordination store: leases
// that expire unless renewed, a compare-and-swap create, deletes guarded by the fencing
// token, and watches. The conformance suite in elector/electortest checks every rule below;
// a new store passes it before anything else.
//
// Rules that hold for every method:
//   - It honours ctx: it returns (with ctx's error or its own) no later than ctx's deadline,
//     and a request that ctx ended may or may not have taken effect; the elector then reads
//     again rather than assume either.
//   - A lease never expires earlier than its TTL after the store handled its last renewal:
//     by the store's clock, or, in a store without expiry of its own (Kubernetes Lease
//     objects), once an observer has seen it unrenewed for a whole TTL on its own
//     monotonic clock. The elector keeps its own, earlier deadline (see lease.go), so the
//     clocks never need to agree.
//   - A lease id and a fencing token are never handed out twice by one store, not even after
//     a failover to a replica that missed the latest writes.
//   - Methods are safe for concurrent use.
type Backend interface {
	// Grant creates a lease that lives for ttl unless renewed, and returns its id and the
	// TTL the store actually granted (it may round or raise the request, never lower it).
	// The TTL counts from when the store handled the request, which is after the caller
	// sent it: sent + granted is a lower bound on the lease's expiry.
	Grant(ctx context.Context, ttl time.Duration) (LeaseID, time.Duration, error)
	// Renew extends the lease once and returns the TTL the store granted, counted from when
	// it handled the request. It returns ErrLeaseNotFound when the lease is gone; a lease
	// that expired is gone for good: no later Renew succeeds.
	Renew(ctx context.Context, id LeaseID) (time.Duration, error)
	// Revoke deletes the lease and every key bound to it (election keys, announcements,
	// acknowledgements), at once. Revoking a lease that is gone is not an error.
	Revoke(ctx context.Context, id LeaseID) error
	// Campaign creates the election's key with value, bound to lease, if and only if the key
	// does not exist, atomically; either way it returns who holds the key afterwards. Among
	// concurrent campaigns at most one wins. A new key gets a token greater than every
	// token the election's key ever had, and the observation of a created key carries the
	// token of the term before it in Prev, where the store keeps it. It fails (ErrLeaseNotFound, or another error) and
	// creates nothing if lease is gone.
	Campaign(ctx context.Context, election string, value []byte, lease LeaseID) (Observation, error)
	// Observe reads the election's key without trying to take it. A key whose lease has
	// expired is reported vacant once the store has noticed the expiry.
	Observe(ctx context.Context, election string) (Observation, error)
	// Watch reports every change of the election's key after revision afterRev, in order,
	// until ctx is cancelled (the channel is then closed) or the watch breaks (one
	// Observation with Err is sent, then the channel is closed). Revisions strictly
	// increase. A change made after afterRev but before Watch was called is reported too.
	// Every kind of change is reported: a new holder, a value rewritten by Update, a
	// delete (Release, Revoke, an operator) and an expiry. A store without history
	// may coalesce changes that follow each other faster than it can report
	// them into the latest one, but never reports a state older than one already reported,
	// and always reports the latest. It never merges a holder's last write into the
	// vacancy that follows it: a vacancy comes after that write was reported (again, if
	// need be, when the watch cannot tell whether it reported it), since followers count
	// a vanished holder's deadline from the last write the watch showed them.
	Watch(ctx context.Context, election string, afterRev int64) <-chan Observation
	// Update replaces the value of the election's key, keeping its lease and token, if its
	// token is still token (and so its lease alive); it reports whether it did. It never
	// creates the key. Watchers see the new value as a change.
	Update(ctx context.Context, election string, token int64, value []byte) (bool, error)
	// Acknowledge records that the holder of term token (under lease) has stopped acting
	// as leader, and why (a short word the elector chooses, opaque to the store), so that
	// its successor may start (see Released). The acknowledgement must outlive lease: a
	// holder that lets go revokes its lease right after (every shutdown does), and an
	// operator may revoke it. It disappears by itself after about the lease's TTL, or when
	// Released reads it.
	Acknowledge(ctx context.Context, election string, token int64, lease LeaseID, why string) error
	// Released reports whether the holder of term token (under lease) is known to have
	// stopped acting as leader: it acknowledged so (the acknowledgement is then consumed,
	// and its why returned; empty if an acknowledgement written by an older release gave
	// none), or, when lease is not 0, its lease no longer exists (why is then empty). A
	// lease that still exists, however little of its TTL is left, does not count as gone:
	// its holder may renew it and go on acting. With lease 0 only the acknowledgement
	// counts, which is how the elector asks: a revoked lease is gone while its holder may
	// still act.
	Released(ctx context.Context, election string, token int64, lease LeaseID) (released bool, why string, err error)
	// Expire deletes the election's key if its token is still token and nothing has
	// written it after revision rev (the Revision of the observation in which the caller
	// saw it last); it reports whether it did. A follower calls it once the holder's
	// heartbeat deadline has passed by its own clock since that observation: the holder
	// has stopped admitting for good, and its key need not wait for the store to notice
	// that the lease expired. It writes no acknowledgement.
	Expire(ctx context.Context, election string, token, rev int64) (bool, error)
	// Release deletes the election's key if its token is still token, and acknowledges
	// the end of that term, for why (as Acknowledge), in the same transaction, so that a
	// deposed leader can never delete its successor's key. It acknowledges even when the
	// key is gone already (an operator deleted it, or a first try whose answer was lost
	// did): the elector calls it only once the term has stopped admitting and its own
	// predecessor is known to have stopped, and the successor must not wait out a TTL for
	// a clean end.
	Release(ctx context.Context, election string, token int64, lease LeaseID, why string) error
	// Announce records that candidate id stands in the election, for as long as lease
	// lives, so that a transfer can tell a live candidate from a typo and an operator can
	// see the whole fleet. value is opaque to the store (the elector encodes it); announcing
	// again replaces the value of id's entry.
	Announce(ctx context.Context, election, id string, value []byte, lease LeaseID) error
	// Candidates lists the candidates that stand in the election now, announced under a
	// lease that is still alive, one entry per id with the value last announced, sorted
	// by id.
	Candidates(ctx context.Context, election string) ([]CandidateEntry, error)
	// WatchCandidates reports the election's live candidates, the whole list each time as
	// Candidates would return it, now and after every change, until ctx ends (the channel
	// is then closed) or the watch breaks (one CandidatesChange with Err, then the channel
	// is closed). The first report is the list at a moment after the call began, and every
	// change after that moment comes in a later report. A change is an entry announced, one
	// announced again with another value, or one gone with its lease: revoked, or expired
	// once the store has noticed (as Candidates would no longer list it). Each report is
	// the list at one moment of the store, reports come in the store's order, and none
	// shows a state older than one already reported. A store without history may
	// coalesce changes that follow each other faster than it can report them into the
	// latest list, but always reports the latest; a report may equal the one before it
	// (an id announced again with the same value under a new lease).
	WatchCandidates(ctx context.Context, election string) <-chan CandidatesChange
	// AppendHistory adds entry (opaque to the store) to the end of the election's history
	// of terms, and drops the oldest entries beyond the newest keep, atomically: of two
	// concurrent appends neither is lost (unless keep drops it). The history outlives
	// every lease.
	AppendHistory(ctx context.Context, election string, entry []byte, keep int) error
	// History returns the election's history, oldest entry first; empty when there is none.
	History(ctx context.Context, election string) ([][]byte, error)
	// SetIntent publishes a request to the election's candidates (resign, transfer),
	// replacing any earlier one; it disappears by itself after ttl (by the store's clock).
	SetIntent(ctx context.Context, election string, value []byte, ttl time.Duration) error
	// ClearIntent deletes the election's intent if it still holds value (whatever it
	// holds, if value is nil): the instance that acted on an intent clears that one, and
	// an intent set since, for the next handover, stays.
	ClearIntent(ctx context.Context, election string, value []byte) error
	// WatchIntent reports the election's current intent (nil when there is none) and
	// every later change, until ctx ends (the channel is then closed) or the watch breaks
	// (one IntentChange with Err, then the channel is closed).
	WatchIntent(ctx context.Context, election string) <-chan IntentChange
	// Close releases the backend's connections. It does not revoke anything.
	Close() error
}

// CandidateEntry is one live candidate as Backend.Candidates lists it.
type CandidateEntry struct {
	// ID is the candidate's instance id.
	ID string
	// Value is what the candidate last announced (an encoded CandidateInfo).
	Value []byte
}

// CandidatesChange is an election's list of live candidates as a watch reports it.
type CandidatesChange struct {
	// Candidates lists the live candidates, one entry per id with the value last
	// announced, sorted by id; empty when there are none.
	Candidates []CandidateEntry
	// Err is set (and nothing else) when the watch broke.
	Err error
}

// IntentChange is an election's intent as a watch reports it.
type IntentChange struct {
	// Value is the intent, nil when there is none.
	Value []byte
	// Err is set (and nothing else) when the watch broke.
	Err error
}

// HeartbeatGrouper is implemented by a store that can carry the heartbeats of many
// elections in one write: the elections of a group (a shard set's, named <group>.<n>).
// Without it, every held key is rewritten at every renewal, and an idle fleet's store load
// grows with the number of keys held.
//
// After GroupHeartbeats(group), for the elections named group.<anything>, the rules of
// Backend still hold as the elector sees them, and a store may meet three of them another
// way:
//   - Update with the value the key already holds (a heartbeat) may write, instead of the
//     key, one beacon of the key's lease for the whole group, that every heartbeat of the
//     lease's keys in the group waiting at that moment shares. It reports true only if the
//     key was still the term's when the beacon was written, false only if it certainly was
//     not.
//   - Watch then reports a beacon of the holder's lease as a change of the key, at the
//     beacon's revision, in the store's order with the key's own changes: a vacancy comes
//     after every beacon of its holder written before it.
//   - Expire deletes the key only if neither the key nor its holder's beacon was written
//     after rev.
//
// A store that cannot order the beacon with the keys in one watch, or guard Expire with it,
// does not implement HeartbeatGrouper. Every instance of a fleet groups the same
// elections: the shard set's configuration says which, and an instance that did not group
// them would take a beacon's silence for the holder's.
type HeartbeatGrouper interface {
	// GroupHeartbeats groups the elections named group.<anything> from now on. It is
	// called before any of them is campaigned for or watched, and calling it again does
	// nothing.
	GroupHeartbeats(group string)
}

// IntentGrouper is implemented by a store that can watch the intents of every election of
// a group (a shard set's, named <group>.<n>) in one watch, so that a set's instances need
// no watch per shard for the transfers and resigns that are rarely asked.
type IntentGrouper interface {
	// WatchGroupIntents reports the intents of the elections named group.<anything>, as
	// WatchIntent would report each: first a report with All set that lists every one
	// that has an intent (the others have none), then the changes, each report listing
	// the elections whose intent changed (nil: it has none any more), or again a whole
	// list with All set, until ctx ends (the channel is then closed) or the watch breaks
	// (one report with Err, then the channel is closed). Reports come in the store's
	// order, and none shows an older intent of an election than one already reported. A
	// store without history may coalesce changes that follow each other faster than it
	// can report them, but always reports the latest.
	WatchGroupIntents(ctx context.Context, group string) <-chan GroupIntents
}

// GroupIntents is a report of IntentGrouper.WatchGroupIntents.
type GroupIntents struct {
	// All is set when Intents lists every election of the group that has an intent.
	All bool
	// Intents maps an election's name to its intent, nil when it has none.
	Intents map[string][]byte
	// Err is set (and nothing else) when the watch broke.
	Err error
}

// SeenWatcher is implemented by a store whose Watch first reads who held the key at
// afterRev (to know whose heartbeats a later beacon stands for: HeartbeatGrouper). Its
// WatchSeen is Watch(ctx, election, seen.Revision) for a caller that observed the key at
// that revision (seen, from Campaign or Observe), and it takes the holder from seen
// instead of reading it: a set's thousands of watches then cost no read each.
type SeenWatcher interface {
	WatchSeen(ctx context.Context, election string, seen Observation) <-chan Observation
}

// IntentCreator is implemented by a store that can store an intent only where none is
// pending. CreateIntent is SetIntent, except that it leaves an intent that is stored and
// not expired as it is, and then reports created false. A shard's preempt asks through it,
// so that two instances asking for a shard at the same moment, or an instance and an
// operator, do not replace each other's requests.
type IntentCreator interface {
	CreateIntent(ctx context.Context, election string, value []byte, ttl time.Duration) (created bool, err error)
}

// WakingWatcher is implemented by a store whose watches can tell their reader, without a
// goroutine of its own waiting on the channel, that there is something to read. WatchWaking
// is WatchSeen, and calls wake after each observation it queues on the channel and after
// it closes the channel. wake returns at once and may be called with the store's locks
// held. A shard set's thousands of campaign loops then wait for their keys with no
// goroutine each (follower.go).
type WakingWatcher interface {
	WatchWaking(ctx context.Context, election string, seen Observation, wake func()) <-chan Observation
}
