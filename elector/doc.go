// Package elector is the store-neutral leader election: a Candidate holds one lease in a
// coordination store and campaigns in any number of named Elections, and each Election
// decides, on every request and without asking the store, whether this instance may act as
// the leader right now.
//
// # What it assumes
//
// The store (a Backend) gives leases that expire unless renewed, a compare-and-swap create of
// an election key bound to a lease, guarded updates and deletes, and an ordered watch of the
// key; the key's token (its create revision, or term) strictly increases from term to term.
// The hosts' clocks advance at about the same rate as the store's, within a tenth of the TTL
// over a TTL, and keep advancing while the process runs.
//
// # What it guarantees
//
// At most one instance admits at any moment. A candidate renews its lease every TTL/3, and
// after each successful renewal its lease deadline becomes the time it sent that renewal plus
// the granted TTL minus a tenth: the store keeps the lease at least a TTL after it handled the
// renewal, which is later, so the deadline passes before the key can be taken (lease.go).
// Every admission checks the deadline on the monotonic and the wall clock, so a process that
// froze, or lost the store, admits nothing once it is past.
//
// The key can also vanish early, when an operator deletes it or revokes the lease. So the
// holder rewrites its key with every renewal and admits only until beatWindow after sending
// its last rewrite (heartbeat.go), and the term ends when that passes. A new holder admits
// only once it can prove that every term before it has stopped (settle.go): the store names
// the previous term (Observation.Prev), whose holder acknowledged its end, or whose last
// heartbeat the new holder received a TTL ago; a term it never saw is waited out for a TTL
// from the moment the key was found vacant. After a crash that wait ends within a round
// trip of the lease's expiry; a fleet starting cold waits one TTL. A term that has not
// proven its own predecessor stopped neither releases nor acknowledges until it has, so an
// acknowledgement always vouches for everyone before it.
//
// A handover (Resign, a transfer, a shutdown) stops admitting, drains admitted requests,
// closes the term for good and only then deletes the key and acknowledges in one transaction
// (handover.go), retrying until it lands or the lease is given up. Forwarded requests are admitted only under the term they were sent to, once
// it has settled and until it starts its release (admission.go).
//
// # What it does not guarantee
//
// A request admitted just before a deadline can still reach a backend after the successor
// starts; the fencing token (Term.Token) is how a backend refuses it. A machine whose clocks
// stop while it is suspended resumes believing its deadlines ahead until its next renewal or
// watch event. Liveness needs the store: without it nobody leads, unless failsafe mode is on
// and every candidate confirms the leader (failsafe.go).
//
// # Files
//
// candidate.go (a candidate's lifecycle), keepalive.go (its lease), election.go (one
// election's state), campaign.go (the campaign loop), observe.go (turning observations into
// published Terms), admission.go (the hot path), heartbeat.go, settle.go, handover.go,
// intent.go (resign and transfer requests through the store), registry.go (the view of the
// candidates that a handover consults), movelog.go (a shard set's moves summed up in the
// log), term.go, lease.go, backend.go
// (the store's contract).
package elector
