package electortest_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// The elector's own logic, driven through the in-memory store: no server, and time moves
// only when a test advances the store's clock.

const (
	ttl = 2 * time.Second
	// within bounds every wait, far beyond what a correct run needs: time on the fake
	// store's clock does not pass by itself, so nothing here waits for a ttl.
	within = 10 * time.Second
)

// parallel is how many tests run side by side unless -parallel says otherwise: every test
// that can, does (t.Parallel), and nearly all of their time goes into waiting out real time
// (the first winner's ttl, a failsafe round, a lease running out) on in-memory fleets that
// use little CPU. go test's own default, GOMAXPROCS, would run them two at a time on two
// cores, one after the other in all but name.
const parallel = "64"

func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", parallel); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}

// clients maps each member of a fake fleet to its connection to the store. The tests run
// side by side (t.Parallel), each with a store of its own: the map is shared, the fleets not.
var (
	clientsMu sync.Mutex
	clients   = map[*electortest.Fleet][]*electortest.Client{}
)

// fleetClients is the connections of f's members, in the order of f.Members.
func fleetClients(f *electortest.Fleet) []*electortest.Client {
	clientsMu.Lock()
	defer clientsMu.Unlock()
	return clients[f]
}

func fakeFleet(t *testing.T, n int) (*electortest.Fleet, *electortest.Store) {
	return meshedFleet(t, n, nil)
}

// meshedFleet is fakeFleet whose candidates run with failsafe mode over mesh (none if nil).
func meshedFleet(t *testing.T, n int, mesh *electortest.Mesh) (*electortest.Fleet, *electortest.Store) {
	s := electortest.NewStore()
	var cs []*electortest.Client
	f := electortest.StartFleet(t, electortest.FleetOptions{
		Size: n,
		TTL:  ttl,
		Backend: func(testing.TB, int) elector.Backend {
			c := s.Client()
			cs = append(cs, c)
			return c
		},
		Now:  s.Now,
		Mesh: mesh,
	})
	clientsMu.Lock()
	clients[f] = cs
	clientsMu.Unlock()
	// Cleanup runs last-in first-out: the store comes back before the candidates close.
	t.Cleanup(func() {
		s.SetDown(nil)
		for _, c := range cs {
			c.SetDown(nil)
		}
		clientsMu.Lock()
		delete(clients, f)
		clientsMu.Unlock()
	})
	coldStart(t, f, s)
	return f, s
}

// coldStart runs s's clock at about real speed until f has a leader: the first winner of
// an election cannot prove that no term it never saw still admits, and waits a ttl.
func coldStart(t *testing.T, f *electortest.Fleet, s *electortest.Store) {
	stop := keepTime(t, s)
	defer stop()
	f.Leader(within)
}

// client is member m's connection to the store.
func client(f *electortest.Fleet, m *electortest.Member) *electortest.Client {
	for i, x := range f.Members {
		if x == m {
			return fleetClients(f)[i]
		}
	}
	return nil
}

func observe(t *testing.T, s *electortest.Store) elector.Observation {
	t.Helper()
	c := s.Client()
	defer c.Close()
	o, err := c.Observe(context.Background(), "main")
	if err != nil || o.Holder == nil {
		t.Fatalf("Observe: %+v %v", o.Holder, err)
	}
	return o
}

// keepTime advances s's clock at about real speed (ttl/200 every 10ms) until the test
// ends, or until the function it returns is called.
func keepTime(t *testing.T, s *electortest.Store) (stopNow func()) {
	return s.RunClock(t, ttl/200)
}

func TestElectionOnFakeStore(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// disturb does something to the leader; then a new term is expected, unless
		// sameTerm.
		disturb  func(t *testing.T, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member)
		sameTerm bool
	}{
		{
			name: "resign_hands_over_without_the_clock_moving",
			disturb: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) {
				ctx, cancel := context.WithTimeout(context.Background(), within)
				defer cancel()
				if err := leader.Election.Resign(ctx, time.Hour); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			// Cut off, the leader cannot renew; once a ttl has passed its deadline is
			// behind it and the store has let its lease expire.
			name: "leader_cut_off_steps_down_when_its_lease_runs_out",
			disturb: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) {
				client(f, leader).SetDown(errors.New("cut off"))
				s.Advance(ttl)
				if leader.Leading() {
					t.Fatal("the cut-off leader still leads a whole ttl after its last renewal")
				}
				// The jump cost every member its lease; a member that then finds the key
				// vacant by a read rather than through its watch waits a ttl more for the
				// old leader's heartbeat deadline (it may have missed heartbeats). From here
				// on the clock runs, at about real speed, as it would.
				keepTime(t, s)
			},
		},
		{
			name: "operator_deletes_the_key",
			disturb: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) {
				s.Delete("main")
			},
		},
		{
			name: "leader_keeps_leading_through_a_rewrite_of_its_own_record",
			disturb: func(t *testing.T, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) {
				c := s.Client()
				defer c.Close()
				o := observe(t, s)
				if ok, err := c.Update(context.Background(), "main", o.Holder.Token, o.Holder.Value); !ok || err != nil {
					t.Fatalf("Update: %v %v", ok, err)
				}
			},
			sameTerm: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, s := fakeFleet(t, 3)
			leader, token := f.Leader(within)
			tc.disturb(t, f, s, leader)
			if tc.sameTerm {
				l, tok := f.Leader(within)
				if l != leader || tok != token {
					t.Fatalf("leadership moved from %s (token %d) to %s (token %d)", leader.ID, token, l.ID, tok)
				}
				return
			}
			f.Await("a new term", within, func() bool {
				l := f.Leaders()
				return len(l) == 1 && l[0].Election.Term().Token > token
			})
			for _, c := range fleetClients(f) {
				c.SetDown(nil) // a member cut off comes back and follows
			}
			f.Leader(within)
		})
	}
}

// TestElectionStoreUnreachable checks that a leader cut off from the store keeps leading up
// to its deadline and not a moment after, and that nobody else leads meanwhile.
func TestElectionStoreUnreachable(t *testing.T) {
	t.Parallel()
	f, s := fakeFleet(t, 3)
	leader, _ := f.Leader(within)
	s.SetDown(errors.New("store unreachable"))
	if !leader.Leading() {
		t.Fatal("the leader stopped before its deadline: the clock has not moved")
	}
	s.Advance(ttl)
	if l := f.Leaders(); len(l) != 0 {
		t.Fatalf("%d candidates lead after a whole ttl without the store", len(l))
	}
	s.SetDown(nil)
	f.Leader(within)
}
