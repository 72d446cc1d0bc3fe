// Package beacon holds what the stores' grouped heartbeats (elector.HeartbeatGrouper) share:
// the groups a backend was asked to group, a heartbeat's answer, and how long a beacon
// gathers the heartbeats it carries.
package beacon

import (
	"bytes"
	"strings"
	"sync"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// Gather is how long a beacon waits for the heartbeats of the other keys its lease holds
// once the first has come: they are all sent at one renewal, and one write should carry
// them all, not the first alone and the rest in a second.
const Gather = 20 * time.Millisecond

// Answer is a heartbeat's answer from a beacon: its key was still the term's when the
// beacon was written (Held), certainly was not (Gone), or the store cannot tell (Unknown:
// the key must be written as without a beacon).
type Answer uint8

const (
	Unknown Answer = iota
	Held
	Gone
)

// Decided returns what Backend.Update reports for a, and whether a decides it; an Unknown
// answer does not.
func (a Answer) Decided() (updated, decided bool) {
	return a == Held, a != Unknown
}

// Groups are the groups of elections (named <group>.<anything>) a backend groups, each
// with the store's state G.
type Groups[G any] struct {
	mu sync.Mutex
	m  map[string]*G
}

// Join adds group name, made by newGroup, unless it is there already.
func (gs *Groups[G]) Join(name string, newGroup func() *G) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.m == nil {
		gs.m = map[string]*G{}
	}
	if _, ok := gs.m[name]; !ok {
		gs.m[name] = newGroup()
	}
}

// Of returns the group of election, nil if it has none.
func (gs *Groups[G]) Of(election string) *G {
	i := strings.LastIndexByte(election, '.')
	if i < 0 {
		return nil
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	return gs.m[election[:i]]
}

// Written is what a backend last wrote to each election's key: the term, its lease and the
// value. A heartbeat is an Update that writes the value written last, and only a heartbeat
// may be carried by a beacon.
type Written struct{ m sync.Map }

// written is one election's entry of Written.
type written struct {
	token int64
	lease elector.LeaseID
	value []byte
}

// Won notes that term token, under lease, wrote value to election's key.
func (w *Written) Won(election string, token int64, lease elector.LeaseID, value []byte) {
	w.m.Store(election, written{token: token, lease: lease, value: value})
}

// Rewrote notes that term token wrote value to election's key, if the term's campaign was
// noted (Won): the lease stays the term's.
func (w *Written) Rewrote(election string, token int64, value []byte) {
	if v, ok := w.m.Load(election); ok && v.(written).token == token {
		w.Won(election, token, v.(written).lease, value)
	}
}

// Heartbeat reports the lease of term token of election if value is what was written last
// there: an Update that changes nothing but the key's liveness.
func (w *Written) Heartbeat(election string, token int64, value []byte) (elector.LeaseID, bool) {
	v, ok := w.m.Load(election)
	if !ok {
		return 0, false
	}
	e := v.(written)
	return e.lease, e.token == token && e.lease != 0 && bytes.Equal(e.value, value)
}
