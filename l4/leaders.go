package leaderl4

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/caddyleader/caddy-leader/elector"
)

// leaderAddresses finds the layer-4 address of an election's leader in the candidate
// registry, once per term, from the election's view of it (elector.Election.KnownCandidates):
// a follower pays no store request for the connections it hands over, unless the view's
// watch is broken, and then one for the first connection of a term.
type leaderAddresses struct {
	e    *elector.Election
	mu   sync.Mutex // one lookup at a time
	last atomic.Pointer[leaderAddress]
}

// leaderAddress is the address of the leader of one term.
type leaderAddress struct {
	token int64
	id    string
	addr  string
}

var addressBooks sync.Map // *elector.Election -> *leaderAddresses

// leadersOf returns the address book of election e, shared by every gate that uses it.
func leadersOf(e *elector.Election) *leaderAddresses {
	if v, ok := addressBooks.Load(e); ok {
		return v.(*leaderAddresses)
	}
	v, _ := addressBooks.LoadOrStore(e, &leaderAddresses{e: e})
	return v.(*leaderAddresses)
}

// address returns the layer-4 address that the leader of term t announced, or "" if it
// announced none. It asks the election's view of the registry, kept by a watch, and so
// blocks for one store request at most only while that watch is broken.
func (b *leaderAddresses) address(t *elector.Term) (string, error) {
	if a := b.last.Load(); a != nil && a.token == t.Token && a.id == t.Leader.ID {
		return a.addr, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if a := b.last.Load(); a != nil && a.token == t.Token && a.id == t.Leader.ID {
		return a.addr, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	list, err := b.e.KnownCandidates(ctx)
	if err != nil {
		return "", fmt.Errorf("listing the candidates: %v", err)
	}
	for _, c := range list {
		if c.ID == t.Leader.ID {
			b.last.Store(&leaderAddress{token: t.Token, id: c.ID, addr: c.Layer4})
			return c.Layer4, nil
		}
	}
	return "", nil // not announced (yet): look again next time
}
