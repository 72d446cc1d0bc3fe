package electortest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// The elector's own logic, driven through the in-memory store: no server, and time moves
// only when a test advances the store's clock.

const ttl = 2 * time.Second

type fleet struct {
	t         *testing.T
	store     *electortest.Store
	elections []*elector.Election
}

func newFleet(t *testing.T, n int) *fleet {
	f := &fleet{t: t, store: electortest.NewStore()}
	for i := range n {
		id := fmt.Sprintf("node-%d", i)
		c, err := elector.NewCandidate(elector.Config{
			ID:      id,
			URL:     "http://" + id + ".test",
			TTL:     ttl,
			Backend: f.store.Client(),
			Logger:  zaptest.NewLogger(t).Named(id),
			Now:     f.store.Now,
		})
		if err != nil {
			t.Fatal(err)
		}
		e := c.Election("main")
		c.Start()
		e.Start()
		t.Cleanup(func() {
			f.store.SetDown(nil)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c.Release(e)
			_ = c.Close(ctx)
		})
		f.elections = append(f.elections, e)
	}
	return f
}

// leaders lists the elections that would admit a gated request now.
func (f *fleet) leaders() []*elector.Election {
	var l []*elector.Election
	for _, e := range f.elections {
		if _, ok := e.Check(); ok {
			l = append(l, e)
		}
	}
	return l
}

// await waits until cond holds, failing the test if it does not within a bound far beyond
// what any correct run needs. It fails at once if two elections ever lead together.
func (f *fleet) await(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if n := len(f.leaders()); n > 1 {
			f.t.Fatalf("waiting for %s: %d leaders at once", what, n)
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s never happened", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// settledLeader waits until exactly one election leads and all agree on it.
func (f *fleet) settledLeader() (*elector.Election, int64) {
	f.t.Helper()
	var leader *elector.Election
	var token int64
	f.await("one agreed leader", func() bool {
		l := f.leaders()
		if len(l) != 1 {
			return false
		}
		leader, token = l[0], l[0].Term().Token
		for _, e := range f.elections {
			if t := e.Term(); t.Token != token || t.Leader.ID != leader.Term().Self {
				return false
			}
		}
		return true
	})
	return leader, token
}

func (f *fleet) observer() elector.Backend {
	c := f.store.Client()
	f.t.Cleanup(func() { c.Close() })
	return c
}

func TestElectionOnFakeStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		// disturb does something to the leader; then a new leader with a greater token
		// is expected unless sameLeader.
		disturb    func(t *testing.T, f *fleet, leader *elector.Election)
		sameLeader bool
	}{
		{
			name: "resign_hands_over_without_the_clock_moving",
			disturb: func(t *testing.T, f *fleet, leader *elector.Election) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := leader.Resign(ctx, time.Hour); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "leader_steps_down_when_its_lease_is_lost",
			disturb: func(t *testing.T, f *fleet, leader *elector.Election) {
				o, err := f.observer().Observe(context.Background(), "main")
				if err != nil || o.Holder == nil {
					t.Fatalf("Observe: %+v %v", o.Holder, err)
				}
				f.store.Expire(o.Holder.Lease)
				f.await("the old leader stepping down", func() bool {
					_, ok := leader.Check()
					return !ok
				})
			},
		},
		{
			name: "operator_deletes_the_key",
			disturb: func(t *testing.T, f *fleet, leader *elector.Election) {
				f.store.Delete("main")
			},
		},
		{
			name: "leader_keeps_leading_through_an_update_of_its_own_record",
			disturb: func(t *testing.T, f *fleet, leader *elector.Election) {
				c := f.observer()
				o, err := c.Observe(context.Background(), "main")
				if err != nil || o.Holder == nil {
					t.Fatalf("Observe: %+v %v", o.Holder, err)
				}
				if ok, err := c.Update(context.Background(), "main", o.Holder.Token, o.Holder.Value); !ok || err != nil {
					t.Fatalf("Update: %v %v", ok, err)
				}
			},
			sameLeader: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, 3)
			leader, token := f.settledLeader()
			tc.disturb(t, f, leader)
			if tc.sameLeader {
				l, tok := f.settledLeader()
				if l != leader || tok != token {
					t.Fatalf("leadership moved from %s (token %d) to %s (token %d)",
						leader.Term().Self, token, l.Term().Self, tok)
				}
				return
			}
			f.await("a new term", func() bool {
				l := f.leaders()
				return len(l) == 1 && l[0].Term().Token > token
			})
			_, tok := f.settledLeader()
			if tok <= token {
				t.Fatalf("new token %d does not exceed %d", tok, token)
			}
		})
	}
}

// TestElectionStoreUnreachable checks that a leader cut off from the store keeps leading up
// to its deadline and not a moment after, and that nobody else leads meanwhile.
func TestElectionStoreUnreachable(t *testing.T) {
	f := newFleet(t, 3)
	leader, _ := f.settledLeader()
	f.store.SetDown(errors.New("store unreachable"))
	if _, ok := leader.Check(); !ok {
		t.Fatal("the leader stopped before its deadline: the clock has not moved")
	}
	f.store.Advance(ttl)
	if l := f.leaders(); len(l) != 0 {
		t.Fatalf("%d instances lead after a whole ttl without the store", len(l))
	}
	f.store.SetDown(nil)
	f.settledLeader()
}
