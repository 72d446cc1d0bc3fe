package safety

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// OperatorLinkDelay slows each way of the old leader's links to the store while an operator
// acts, so that it hears late of what the operator did (issue 10's set-up).
const OperatorLinkDelay = 300 * time.Millisecond

// OperatorFault slows the leader's links to the store by OperatorLinkDelay, or cuts them and
// waits half a ttl, lets act strike, waits 2 x ttl and heals the links. Then whoever leads
// must serve a gated request under a newer term.
func OperatorFault[S any](cut bool, act func(s *Run[S]) error) func(s *Run[S]) {
	return func(s *Run[S]) {
		ttl := s.TTL()
		if cut {
			s.Cut(s.Leader)
			time.Sleep(ttl / 2)
		} else {
			s.Delay(s.Leader, OperatorLinkDelay)
		}
		if err := act(s); err != nil {
			s.T.Fatal(err)
		}
		time.Sleep(2 * ttl)
		s.Heal(s.Leader)

		next, token := fleet.WaitStableLeader(s.T, s.Fleet, RecoverTimeout)
		if token <= s.Token {
			s.T.Errorf("after the operator's act, %s leads with token %d, not newer than the old term's %d", next, token, s.Token)
		}
		id := fmt.Sprintf("after-%d", token) // a fleet may go through several scenarios
		if o := s.Post(next, "/gated/after", id); o.Status != http.StatusOK {
			s.T.Errorf("new leader %s: /gated/after = %d, %v; want 200", next, o.Status, o.Err)
		} else if a := s.WaitArrival(id, 5*time.Second, false); a.Token != token || a.ServedBy != next.ID {
			s.T.Errorf("new leader %s (token %d): /gated/after arrived from %s with token %d", next, token, a.ServedBy, a.Token)
		}
		s.Notes = append(s.Notes, fmt.Sprintf("%s:%d leads afterwards", next, token))
	}
}

// SigstopFault freezes the leader for 2 x ttl, then resumes it while requests are sent to
// it: some were queued in the kernel while it was frozen, so its first requests after
// SIGCONT are among them.
func SigstopFault[S any](s *Run[S]) {
	old := s.Leader
	old.Stop()
	s.T.Cleanup(func() { _ = old.Process().Signal(syscall.SIGCONT) })
	time.Sleep(2*s.TTL() - 50*time.Millisecond)

	const workers = 4
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out []Outcome
	)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				o := s.Post(old, "/gated/resumed", fmt.Sprintf("s%d-%04d", w, n))
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(50 * time.Millisecond) // the first requests wait in the frozen process's queue
	s.Mark("resumed")
	old.Cont()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	s.Extra = append(s.Extra, out...)
	s.Notes = append(s.Notes, fmt.Sprintf("%d requests sent to it around SIGCONT: %s", len(out), FmtStatuses(Summarize(out), true)))
}

// DelayFault delays every link of the leader to the store by d each way for 3 x ttl.
func DelayFault[S any](d time.Duration) func(s *Run[S]) {
	return func(s *Run[S]) {
		s.Delay(s.Leader, d)
		time.Sleep(3 * s.TTL())
		s.Heal(s.Leader)
	}
}

// TransferStorm asks, all at once, for every shard of the fleet's shard set (see
// fleet.Config.Shards) to be transferred from its owner to the next instance of the fleet,
// each request sent to another instance's admin API than the last, as many operators acting
// at once would. Every transfer must succeed; placement then draws each shard back to its
// preferred owner, a few at a time: a second storm of moves.
func TransferStorm[S any](s *Run[S]) { transferStorm(s, nil) }

// TransferStormAllowing is TransferStorm where a transfer may also end with one of the
// statuses allowed (say 504, the target did not lead in time, on a store whose heartbeats
// lag behind a client's rate limit): it is counted in the notes, not failed. Safety is
// checked either way.
func TransferStormAllowing[S any](allowed ...int) func(*Run[S]) {
	return func(s *Run[S]) { transferStorm(s, allowed) }
}

func transferStorm[S any](s *Run[S], allowed []int) {
	index := map[string]int{}
	for i, in := range s.Fleet {
		index[in.ID] = i
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	for _, sh := range s.Shards {
		to := s.Fleet[(index[sh.Owner]+1)%len(s.Fleet)]
		via := s.Fleet[sh.Shard%len(s.Fleet)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			// force: each shard goes to another instance than placement prefers, which moves
			// it back: two moves per shard, the storm this scenario is for.
			path := "/leader/" + fleet.ShardElection(sh.Shard) + "/transfer?timeout=10s&force=true&to=" + to.ID
			url := fmt.Sprintf("http://127.0.0.1:%d%s", via.AdminPort, path)
			resp, err := fleet.Send(context.Background(), fleet.Client, http.MethodPost, url, nil, 15*time.Second)
			mu.Lock()
			defer mu.Unlock()
			statuses[resp.Status]++
			if err != nil || resp.Status != http.StatusOK && !slices.Contains(allowed, resp.Status) {
				s.T.Errorf("POST %s to %s (owner %s): %d %v %s", path, via, sh.Owner, resp.Status, err, resp.Body)
			}
		}()
	}
	wg.Wait()
	s.Notes = append(s.Notes, fmt.Sprintf("%d transfers at once: %s", len(s.Shards), FmtStatuses(statuses, true)))
}
