package caddyleader

import "github.com/caddyleader/caddy-leader/electionstatus"

// The roles of this instance in an election (see electionstatus.RoleOf, the one place that
// derives them from a Term).
const (
	RoleLeader      = electionstatus.RoleLeader
	RoleSettling    = electionstatus.RoleSettling
	RoleHandingOver = electionstatus.RoleHandingOver
	RoleFollower    = electionstatus.RoleFollower
	RoleCandidate   = electionstatus.RoleCandidate
)

// settling reports whether this instance holds the key of t's term but waits for the
// previous term to be proven over before it admits.
var settling = electionstatus.Settling
