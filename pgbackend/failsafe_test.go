package pgbackend

import (
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestFailsafeServerStopped stops a real PostgreSQL under a fleet with failsafe on: the
// leader leads throughout (its peers confirm it over the in-memory mesh), and once the
// server is back the fleet agrees on one leader again. The fleet's watchdog fails the test
// if two members ever lead at once.
func TestFailsafeServerStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	const ttl = 2 * time.Second
	server := pgtest.Start(t)
	f := electortest.StartFleet(t, electortest.FleetOptions{
		Size: 3, TTL: ttl, Election: "failsafe", Mesh: electortest.NewMesh(),
		Backend: func(t testing.TB, i int) elector.Backend {
			b, err := New(Config{DSN: server.DSN()})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	})
	leader, token := f.Leader(20 * time.Second)
	f.Await("a confirmed roster", 10*time.Second, func() bool { return len(leader.Election.Failsafe().Roster) == 3 })
	server.Stop(t)
	stopped := time.Now()
	for time.Since(stopped) < 5*ttl {
		if !leader.Leading() {
			t.Fatalf("%s stopped leading %s after the server stopped: %s", leader.ID, time.Since(stopped).Round(time.Millisecond), leader.Election.Term().Reason)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := leader.Election.Failsafe(); !st.Active || leader.Election.Term().Token != token {
		t.Fatalf("failsafe status %+v, want active for term %d", st, token)
	}
	server.Start(t)
	f.Await("one leader after the server is back", 30*time.Second, func() bool { return len(f.Leaders()) == 1 })
}
