package electionstatus

import (
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// The roles of this instance in an election, as `caddy leader status`, GET /leader/, the
// status page and the body of `leader_health` name them. RoleOf is the one place that
// derives them from a Term.
const (
	// RoleLeader: it holds the key and admits, by the same test as every gated request.
	RoleLeader = "leader"
	// RoleSettling: it has just taken the key but waits, up to one ttl, until the previous
	// term is proven over (its holder acknowledged, or its deadline passed) before it admits.
	// A fresh fleet's first winner settles too: it cannot prove that nobody held the key
	// just before.
	RoleSettling = "settling"
	// RoleHandingOver: it holds the key but no longer admits: it drains or releases it for a
	// handover (a stop, resign or transfer), or its lease deadline passed unrenewed.
	RoleHandingOver = "handing_over"
	// RoleFollower: another instance holds the key.
	RoleFollower = "follower"
	// RoleCandidate: no leader is known.
	RoleCandidate = "candidate"
)

// RoleOf names what this instance is in the election that t describes, at now.
func RoleOf(t *elector.Term, now time.Time) string {
	switch {
	case t.Leading(now):
		return RoleLeader
	case Settling(t):
		return RoleSettling
	case t.Holds():
		return RoleHandingOver
	case t.LeaderKnown():
		return RoleFollower
	default:
		return RoleCandidate
	}
}

// Settling reports whether this instance holds the key of t's term but waits for the
// previous term to be proven over before it admits.
func Settling(t *elector.Term) bool { return t.Holds() && t.Settling }
