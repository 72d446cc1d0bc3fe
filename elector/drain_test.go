package elector

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestDrainWakesOnTheLastExit: a drain returns the moment the in-flight count reaches
// zero, with no time passing on the bubble's clock (a drain that polled would return only
// at its next tick), and not before. Each step is a request counted in (enter: admitted,
// or on its way in before it sees the handover and backs out) or out (exit).
func TestDrainWakesOnTheLastExit(t *testing.T) {
	for _, tc := range []struct {
		name string
		// inFlight is the count when the drain starts; steps follow, and the drain must
		// have returned after the last one and not before.
		inFlight int
		steps    []string
	}{
		{name: "last_request_exits", inFlight: 1, steps: []string{"exit"}},
		{name: "requests_exit_one_by_one", inFlight: 3, steps: []string{"exit", "exit", "exit"}},
		// A request entering during the drain is counted while it looks: the last
		// admitted one's exit leaves it in, and its backing out ends the drain.
		{name: "request_entering_backs_out_last", inFlight: 1, steps: []string{"enter", "exit", "exit"}},
		// One admitted while others run (a forwarded request between the drain's two
		// looks) is waited for too.
		{name: "request_admitted_during_the_drain", inFlight: 2, steps: []string{"exit", "enter", "exit", "exit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, err := NewCandidate(Config{ID: "a", TTL: time.Minute, DrainTimeout: time.Hour, Backend: nilBackend{}})
				if err != nil {
					t.Fatal(err)
				}
				e := c.Election("main")
				e.inflight.Add(int64(tc.inFlight))
				start := time.Now()
				done := make(chan struct{})
				go func() {
					defer close(done)
					e.drain(context.Background())
				}()
				for i, step := range tc.steps {
					synctest.Wait()
					select {
					case <-done:
						t.Fatalf("the drain returned before step %d (%s) with %d in flight", i, step, e.InFlight())
					default:
					}
					if step == "enter" {
						e.inflight.Add(1)
					} else {
						e.Exit()
					}
				}
				synctest.Wait()
				select {
				case <-done:
				default:
					t.Fatal("the drain still waits after the last request left")
				}
				if waited := time.Since(start); waited != 0 {
					t.Fatalf("the drain returned %s after the last request left; want at once", waited)
				}
			})
		})
	}
}
