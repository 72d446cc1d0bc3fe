package leaderl4

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/elector"
)

// Placeholders set by the matcher and the gate.
const (
	phElection = "l4.leader.election"
	phIsLeader = "l4.leader.is_leader"
	phSelf     = "l4.leader.self"
	phID       = "l4.leader.id"
	phToken    = "l4.leader.token"
	phAddress  = "l4.leader.address"
	phDial     = "l4.leader.dial"
)

// setPlaceholders makes the connection's leader placeholders answer for term t, decision
// admitted, and the leader's layer-4 address (empty when unknown or not looked up).
func setPlaceholders(repl *caddy.Replacer, t *elector.Term, admitted bool, address string) {
	var token any = ""
	if t.Token != 0 {
		token = t.Token
	}
	repl.Set(phElection, t.Election)
	repl.Set(phIsLeader, admitted)
	repl.Set(phSelf, t.Self)
	repl.Set(phID, t.Leader.ID)
	repl.Set(phToken, token)
	repl.Set(phAddress, address)
}
