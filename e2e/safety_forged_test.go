//go:build unix

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// TestSafetyForgedMark: clients that set Caddy-Leader-Forwarded-By themselves, all along,
// while a new leader waits for its predecessor (the old leader's etcd links are slow and
// the election key is deleted by hand) and then while that leader drains on a graceful
// stop. In every follower mode, no forged request may be admitted by two terms at once.
func TestSafetyForgedMark(t *testing.T) {
	needCaddy(t)
	for _, mode := range []string{"reject", "redirect", "forward"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // a world of its own (see TestSafety)
			runScenario(t, safetyScenario{
				Name:   "forged_mark_during_settling_and_draining_" + mode,
				Load:   12 * time.Second,
				Change: safety.MustChange,
				Config: func(c *Config) { c.Follower = mode },
				Fault:  forgedMarkFault,
			})
		})
	}
}

// forgedMarkFault sends requests with forged marks to every instance while the leader's
// links to etcd are slowed by 300ms each way and its key is deleted, and then while the
// next leader stops gracefully.
func forgedMarkFault(s *scenarioRun) {
	forged := []string{
		"c0",
		fmt.Sprintf("c1; token=%d; at=%d; mac=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", s.Token, time.Now().UnixMilli()),
	}
	stop := make(chan struct{})
	sent := make(chan outcome, 64)
	collected := make(chan []outcome)
	go func() {
		var out []outcome
		for o := range sent {
			out = append(out, o)
		}
		collected <- out
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			for _, in := range s.Fleet {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sent <- s.PostMarked(in, "/gated/forged", fmt.Sprintf("forged-%d-%s", n, in.ID), forged[n%len(forged)])
				}()
			}
		}
	}()

	// Settling: the successor waits for the old leader, which hears late of its end.
	s.Delay(s.Leader, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := s.Store.Client().Delete(ctx, "/caddy-leader/default"); err != nil {
		s.T.Fatalf("delete the election key: %v", err)
	}
	cancel()
	time.Sleep(2 * ttl)
	s.Heal(s.Leader)

	// Draining: whoever leads now stops gracefully.
	next, _ := WaitStableLeader(s.T, s.Fleet, safety.RecoverTimeout)
	s.Survivors = others(s.Fleet, next)
	s.Load.MarkDown(next)
	next.Term()
	time.Sleep(ttl)
	close(stop)
	wg.Wait()
	close(sent)
	s.Extra = append(s.Extra, <-collected...)
}
