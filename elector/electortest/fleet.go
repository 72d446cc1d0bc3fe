package electortest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
)

// FleetOptions describe a fleet of candidates in one election.
type FleetOptions struct {
	// Size is the number of candidates.
	Size int
	// TTL is every candidate's lease ttl.
	TTL time.Duration
	// Election is the election's name; "main" if empty.
	Election string
	// Backend returns candidate i's own client of the store under test.
	Backend func(t testing.TB, i int) elector.Backend
	// Now, if set, is every candidate's clock (the fake store's Now).
	Now func() time.Time
	// Mesh, if set, connects the candidates' failsafe endpoints: every candidate runs
	// with failsafe mode.
	Mesh *Mesh
}

// Member is one candidate of a Fleet.
type Member struct {
	ID        string
	Candidate *elector.Candidate
	Election  *elector.Election
}

// Leading reports whether m would admit a gated request now.
func (m *Member) Leading() bool {
	_, ok := m.Election.Check()
	return ok
}

// Fleet is a set of candidates in one election, and a watchdog that fails the test if two
// of them ever admit at the same moment.
type Fleet struct {
	t        testing.TB
	Members  []*Member
	overlaps atomic.Int64
	stop     chan struct{}
	done     chan struct{}
}

// StartFleet starts o.Size candidates; t.Cleanup closes them and reports double leadership.
func StartFleet(t testing.TB, o FleetOptions) *Fleet {
	t.Helper()
	if o.Election == "" {
		o.Election = "main"
	}
	f := &Fleet{t: t, stop: make(chan struct{}), done: make(chan struct{})}
	for i := range o.Size {
		id := fmt.Sprintf("node-%d", i)
		cfg := elector.Config{
			ID:           id,
			URL:          "http://" + id + ".test:8080",
			TTL:          o.TTL,
			DrainTimeout: time.Second,
			Backend:      o.Backend(t, i),
			Logger:       zaptest.NewLogger(t).Named(id),
			Now:          o.Now,
		}
		if o.Mesh != nil {
			cfg.Failsafe = &elector.FailsafeConfig{URL: MeshURL(id), Transport: o.Mesh.From(id)}
		}
		c, err := elector.NewCandidate(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if o.Mesh != nil {
			o.Mesh.Add(id, c)
		}
		m := &Member{ID: id, Candidate: c, Election: c.Election(o.Election)}
		c.Start()
		m.Election.Start()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c.Release(m.Election)
			_ = c.Close(ctx)
		})
		f.Members = append(f.Members, m)
	}
	go f.watchdog()
	t.Cleanup(func() {
		close(f.stop)
		<-f.done
		if n := f.overlaps.Load(); n > 0 {
			t.Errorf("double leadership: %d samples in which two candidates admitted at once", n)
		}
	})
	return f
}

func (f *Fleet) watchdog() {
	defer close(f.done)
	prev := f.sample()
	for {
		select {
		case <-f.stop:
			return
		default:
		}
		next := f.sample()
		if Overlapped(prev, next) {
			f.overlaps.Add(1)
		}
		prev = next
		time.Sleep(500 * time.Microsecond)
	}
}

// sample reads every member once, in order.
func (f *Fleet) sample() []Sample {
	s := make([]Sample, len(f.Members))
	for i, m := range f.Members {
		s[i] = SampleOf(m.Election)
	}
	return s
}

// Leaders lists the members that would admit a gated request now.
func (f *Fleet) Leaders() []*Member {
	var l []*Member
	for _, m := range f.Members {
		if m.Leading() {
			l = append(l, m)
		}
	}
	return l
}

// Overlaps is how many watchdog samples saw two leaders so far.
func (f *Fleet) Overlaps() int64 { return f.overlaps.Load() }

// Await waits until cond holds, and fails the test if it does not within a bound.
func (f *Fleet) Await(what string, within time.Duration, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("%s did not happen within %s", what, within)
		}
		time.Sleep(time.Millisecond)
	}
}

// Leader waits until exactly one member leads and every member names it, and returns it
// with its token.
func (f *Fleet) Leader(within time.Duration) (*Member, int64) {
	f.t.Helper()
	var leader *Member
	var token int64
	f.Await("one agreed leader", within, func() bool {
		l := f.Leaders()
		if len(l) != 1 {
			return false
		}
		leader, token = l[0], l[0].Election.Term().Token
		for _, m := range f.Members {
			if t := m.Election.Term(); t.Token != token || t.Leader.ID != leader.ID {
				return false
			}
		}
		return true
	})
	return leader, token
}

// NewLeader waits for a member other than old to lead with a token above token, and returns
// it with its token and when it was first seen leading.
func (f *Fleet) NewLeader(old *Member, token int64, within time.Duration) (*Member, int64, time.Time) {
	f.t.Helper()
	var next *Member
	var tok int64
	f.Await("a new leader", within, func() bool {
		for _, m := range f.Members {
			if m != old && m.Leading() && m.Election.Term().Token > token {
				next, tok = m, m.Election.Term().Token
				return true
			}
		}
		return false
	})
	return next, tok, time.Now()
}
