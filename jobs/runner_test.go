package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/jobs"
)

const ttl = time.Second

// service stands for the service a job calls: it records every run, and counts two runs
// of the job under way at once (on any instances) and slots finished twice.
type service struct {
	t  *testing.T
	mu sync.Mutex
	// act decides how each run behaves; nil succeeds at once.
	act      func(ctx context.Context, r jobs.Run) error
	running  int
	overlaps int
	runs     []jobs.Run // in the order they began
	ended    []jobs.Run // runs whose action returned nil, in order
	endedAt  []time.Time
	done     map[int64]int // by slot, in Unix nanoseconds (a slot read back from the store has lost its zone)
	changed  chan struct{}
}

func newService(t *testing.T) *service {
	s := &service{t: t, done: make(map[int64]int), changed: make(chan struct{})}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.overlaps > 0 {
			t.Errorf("two runs of the job were under way at once %d times", s.overlaps)
		}
		for slot, n := range s.done {
			if n > 1 {
				t.Errorf("slot %s finished %d times", time.Unix(0, slot).UTC().Format(time.RFC3339Nano), n)
			}
		}
	})
	return s
}

func (s *service) action(ctx context.Context, r jobs.Run) error {
	s.mu.Lock()
	s.running++
	if s.running > 1 {
		s.overlaps++
	}
	s.runs = append(s.runs, r)
	act := s.act
	s.wakeLocked()
	s.mu.Unlock()
	var err error
	if act != nil {
		err = act(ctx, r)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	if err == nil {
		if !r.Manual {
			s.done[r.Slot.UnixNano()]++
		}
		s.ended = append(s.ended, r)
		s.endedAt = append(s.endedAt, time.Now())
	}
	s.wakeLocked()
	return err
}

func (s *service) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// holdFirst has s's first run return only when hold does (given that run's context),
// and its other runs succeed at once. The function it returns is that first run, once it
// has begun.
func (s *service) holdFirst(hold func(ctx context.Context) error) (first func() jobs.Run) {
	var mu sync.Mutex
	var held *jobs.Run
	s.act = func(ctx context.Context, r jobs.Run) error {
		mu.Lock()
		isFirst := held == nil
		if isFirst {
			held = &r
		}
		mu.Unlock()
		if isFirst {
			return hold(ctx)
		}
		return nil
	}
	return func() jobs.Run {
		mu.Lock()
		defer mu.Unlock()
		return *held
	}
}

// await waits until cond (called with s.mu held) holds.
func (s *service) await(what string, within time.Duration, cond func() bool) {
	s.t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, changed := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			s.t.Fatalf("%s did not happen within %s", what, within)
		}
	}
}

// jobFleet is a fleet of n candidates on the in-memory store, each running spec.
type jobFleet struct {
	*electortest.Fleet
	store   *electortest.Store
	clients []*electortest.Client
	runners []*jobs.Runner
}

func startJobFleet(t *testing.T, n int, spec jobs.Spec, events jobs.Events) *jobFleet {
	s := electortest.NewStore()
	s.RunClock(t, 5*time.Millisecond)
	var clients []*electortest.Client
	f := electortest.StartFleet(t, electortest.FleetOptions{
		Size: n,
		TTL:  ttl,
		Backend: func(testing.TB, int) elector.Backend {
			c := s.Client()
			clients = append(clients, c)
			return c
		},
		Now: s.Now,
	})
	jf := &jobFleet{Fleet: f, store: s, clients: clients}
	for i, m := range f.Members {
		r := jobs.NewRunner(spec, clients[i], []jobs.Lead{m.Election}, nil,
			jobs.Config{Instance: m.ID, Logger: zaptest.NewLogger(t).Named(m.ID), Events: events})
		r.Start()
		t.Cleanup(r.Stop)
		jf.runners = append(jf.runners, r)
	}
	t.Cleanup(func() { s.SetDown(nil) })
	return jf
}

func (f *jobFleet) runnerOf(m *electortest.Member) *jobs.Runner {
	for i, x := range f.Members {
		if x == m {
			return f.runners[i]
		}
	}
	panic("not a member")
}

func TestASteadyLeaderRunsEverySlotOnce(t *testing.T) {
	t.Parallel()
	svc := newService(t)
	f := startJobFleet(t, 3, jobs.Spec{Name: "sweep", Schedule: jobs.Every(50 * time.Millisecond), Action: svc.action}, jobs.Events{})
	leader, token := f.Leader(3 * ttl)
	svc.await("ten runs", 5*time.Second, func() bool { return len(svc.ended) >= 10 })
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for i, r := range svc.ended[:10] {
		if r.Instance != leader.ID || r.Token != token {
			t.Errorf("run %d by %s under token %d, want %s under %d", i, r.Instance, r.Token, leader.ID, token)
		}
		if i > 0 && !r.Slot.After(svc.ended[i-1].Slot) {
			t.Errorf("run %d is for slot %s, not after the one before, %s", i, r.Slot, svc.ended[i-1].Slot)
		}
		if r.Slot.UnixNano()%int64(50*time.Millisecond) != 0 {
			t.Errorf("run %d is for slot %s, not a multiple of the interval", i, r.Slot)
		}
	}
}

func TestAHandoverLetsTheRunFinishFirst(t *testing.T) {
	t.Parallel()
	svc := newService(t)
	release := make(chan struct{})
	svc.holdFirst(func(ctx context.Context) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	f := startJobFleet(t, 3, jobs.Spec{Name: "report", Schedule: jobs.Every(100 * time.Millisecond), Action: svc.action}, jobs.Events{})
	leader, token := f.Leader(3 * ttl)
	svc.await("the first run", 5*time.Second, func() bool { return len(svc.runs) == 1 })
	resigned := make(chan error, 1)
	go func() { resigned <- leader.Election.Resign(context.Background(), ttl) }()
	// The drain waits for the run: nobody else leads meanwhile.
	time.Sleep(200 * time.Millisecond)
	if l := f.Leaders(); len(l) != 0 {
		t.Fatalf("%d instances admit while the leader drains its run", len(l))
	}
	close(release)
	if err := <-resigned; err != nil {
		t.Fatal(err)
	}
	_, next, _ := f.NewLeader(leader, token, 3*ttl)
	svc.await("a run under the successor", 5*time.Second, func() bool {
		return len(svc.ended) > 1 && svc.ended[len(svc.ended)-1].Token == next
	})
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if first := svc.ended[0]; first.Token != token || first.Rerun {
		t.Errorf("the first run finished as %+v, want under token %d, not a rerun", first, token)
	}
	for _, r := range svc.ended[1:] {
		if r.Rerun {
			t.Errorf("slot %s ran again though the run before the handover finished it", r.Slot)
		}
	}
}

func TestAnUnfinishedSlotRunsAgainUnderTheNextTerm(t *testing.T) {
	t.Parallel()
	svc := newService(t)
	held := svc.holdFirst(func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	f := startJobFleet(t, 3, jobs.Spec{Name: "sweep", Schedule: jobs.Every(200 * time.Millisecond), Action: svc.action}, jobs.Events{})
	leader, token := f.Leader(3 * ttl)
	svc.await("the first run", 5*time.Second, func() bool { return len(svc.runs) == 1 })
	f.store.Delete(leader.Election.Name())
	svc.await("the slot again", 3*ttl, func() bool {
		for _, r := range svc.ended {
			if r.Slot.Equal(held().Slot) {
				return true
			}
		}
		return false
	})
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for _, r := range svc.ended {
		if r.Slot.Equal(held().Slot) && (!r.Rerun || r.Token <= token) {
			t.Errorf("slot %s ran again as %+v: want a rerun under a token above %d", r.Slot, r, token)
		}
	}
}

func TestSlotsMissedWhileNobodyLed(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{jobs.MissedRunOnce, jobs.MissedSkip} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			svc := newService(t)
			events, missedSlots := countMissed(jobs.MissedNoLeader)
			// Before the store goes, the runs fail: a run that succeeded while the store went
			// away could not record its finish, and the next leader, if the other instance,
			// would run its slot again (docs/jobs.md: the service refuses that by the token).
			var refusing atomic.Bool
			failedRecorded := make(chan struct{}, 1)
			events.Finished = func(_ jobs.Run, result string, _ time.Duration, _ error) {
				if result == jobs.ResultFailed {
					select {
					case failedRecorded <- struct{}{}:
					default:
					}
				}
			}
			svc.act = func(context.Context, jobs.Run) error {
				if refusing.Load() {
					return errors.New("refused while the store is taken away")
				}
				return nil
			}
			f := startJobFleet(t, 2, jobs.Spec{Name: "sweep", Schedule: jobs.Every(100 * time.Millisecond),
				Action: svc.action, Missed: policy}, events)
			_, token := f.Leader(3 * ttl)
			svc.await("a run", 5*time.Second, func() bool { return len(svc.ended) >= 1 })
			refusing.Store(true)
			// A failed run's finish is recorded: so was every run's before it (a job's runs
			// under one term record in order).
			select {
			case <-failedRecorded:
			case <-time.After(5 * time.Second):
				t.Fatal("no failed run recorded")
			}
			// The store goes away: the leader stops at its deadline, and nobody leads until
			// the store is back.
			f.store.SetDown(errors.New("store down"))
			f.Await("no leader", 3*ttl, func() bool { return len(f.Leaders()) == 0 })
			time.Sleep(500 * time.Millisecond)
			svc.mu.Lock()
			before := len(svc.ended)
			svc.mu.Unlock()
			f.store.SetDown(nil)
			refusing.Store(false)
			_, _, _ = f.NewLeader(nil, token, 4*ttl)
			// The first run of a new slot: a failed run whose finish the outage kept from the
			// store is run again first.
			var after jobs.Run
			svc.await("a run after the outage", 5*time.Second, func() bool {
				for _, r := range svc.ended[before:] {
					if !r.Rerun {
						after = r
						return true
					}
				}
				return false
			})
			missed := missedSlots()
			switch policy {
			case jobs.MissedRunOnce:
				if after.Missed == 0 || missed != after.Missed {
					t.Errorf("first run after the outage stands for %d missed slots, %d counted; want the same, above 0", after.Missed, missed)
				}
			case jobs.MissedSkip:
				if after.Missed != 0 || missed == 0 {
					t.Errorf("first run after the outage stands for %d missed slots, %d counted; want 0 and some", after.Missed, missed)
				}
			}
		})
	}
}

// countMissed returns Events that count the slots missed for why, and the count so far.
func countMissed(why string) (jobs.Events, func() int) {
	var mu sync.Mutex
	missed := 0
	events := jobs.Events{Missed: func(_, _ string, n int, reason string) {
		if reason == why {
			mu.Lock()
			missed += n
			mu.Unlock()
		}
	}}
	return events, func() int {
		mu.Lock()
		defer mu.Unlock()
		return missed
	}
}

func TestOverlap(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{jobs.OverlapSkip, jobs.OverlapWait} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			svc := newService(t)
			svc.act = func(ctx context.Context, r jobs.Run) error {
				time.Sleep(250 * time.Millisecond) // two and a half slots
				return nil
			}
			events, overlappedSlots := countMissed(jobs.MissedOverlap)
			f := startJobFleet(t, 1, jobs.Spec{Name: "slow", Schedule: jobs.Every(100 * time.Millisecond),
				Action: svc.action, Overlap: policy}, events)
			f.Leader(3 * ttl)
			svc.await("three runs", 5*time.Second, func() bool { return len(svc.ended) >= 3 })
			svc.mu.Lock()
			a, aEnded, b := svc.ended[1], svc.endedAt[1], svc.ended[2]
			svc.mu.Unlock()
			if overlappedSlots() == 0 {
				t.Error("no slot counted missed for overlap, though every run covers two")
			}
			switch policy {
			case jobs.OverlapSkip:
				// The slots due during a run are skipped: the next run is for a slot that
				// came after it ended.
				if !b.Slot.After(aEnded) {
					t.Errorf("run for slot %s follows a run that ended at %s: want a later slot", b.Slot, aEnded)
				}
			case jobs.OverlapWait:
				// The newest slot due when a run ends runs at once.
				if b.Slot.After(aEnded) || b.Slot.Sub(a.Slot) < 200*time.Millisecond {
					t.Errorf("run for slot %s follows a run for %s that ended at %s: want the newest slot due then",
						b.Slot, a.Slot, aEnded)
				}
			}
		})
	}
}

func TestRetriesAndTimeouts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		spec     jobs.Spec
		act      func(ctx context.Context, r jobs.Run) error
		result   string
		attempts int
	}{
		{"succeeds on the third attempt", jobs.Spec{Retries: 3, Backoff: 10 * time.Millisecond},
			func(_ context.Context, r jobs.Run) error {
				if r.Attempt < 3 {
					return fmt.Errorf("attempt %d fails", r.Attempt)
				}
				return nil
			}, jobs.ResultOK, 3},
		{"fails after its retries", jobs.Spec{Retries: 1, Backoff: 10 * time.Millisecond},
			func(context.Context, jobs.Run) error { return errors.New("always") }, jobs.ResultFailed, 2},
		{"times out", jobs.Spec{Timeout: 20 * time.Millisecond},
			func(ctx context.Context, _ jobs.Run) error { <-ctx.Done(); return ctx.Err() }, jobs.ResultTimeout, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			type finished struct {
				r      jobs.Run
				result string
			}
			got := make(chan finished, 16)
			spec := tc.spec
			spec.Name, spec.Schedule, spec.Action = "job", jobs.Every(time.Hour), tc.act
			events := jobs.Events{Finished: func(r jobs.Run, result string, _ time.Duration, _ error) {
				got <- finished{r, result}
			}}
			f := startJobFleet(t, 1, spec, events)
			leader, _ := f.Leader(3 * ttl)
			f.Await("the runner ready", 3*ttl, func() bool {
				_, err := f.runnerOf(leader).RunNow(-1)
				return err == nil
			})
			select {
			case fin := <-got:
				if fin.result != tc.result || fin.r.Attempt != tc.attempts {
					t.Errorf("run ended %s after %d attempts, want %s after %d", fin.result, fin.r.Attempt, tc.result, tc.attempts)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the run did not end")
			}
		})
	}
}

func TestAJobOnShardsRunsEachShardsSlotsUnderItsOwner(t *testing.T) {
	t.Parallel()
	const shards = 4
	var mu sync.Mutex
	var runs []jobs.Run
	running := make(map[int]int)
	action := func(_ context.Context, r jobs.Run) error {
		mu.Lock()
		running[r.Shard]++
		if running[r.Shard] > 1 {
			t.Errorf("two runs of shard %d at once", r.Shard)
		}
		runs = append(runs, r)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		running[r.Shard]--
		mu.Unlock()
		return nil
	}
	s := electortest.NewStore()
	s.RunClock(t, 5*time.Millisecond)
	f := electortest.StartFleet(t, electortest.FleetOptions{
		Size: 2, TTL: ttl, Election: "rooms.0", Now: s.Now,
		Backend: func(testing.TB, int) elector.Backend { return s.Client() },
	})
	spec := jobs.Spec{Name: "sweep", Schedule: jobs.Every(100 * time.Millisecond), Action: action}
	elections := make(map[string][]*elector.Election) // instance -> its shard elections
	for _, m := range f.Members {
		leads := []jobs.Lead{m.Election}
		numbers := []int{0}
		elections[m.ID] = []*elector.Election{m.Election}
		for i := 1; i < shards; i++ {
			e := m.Candidate.Election(fmt.Sprintf("rooms.%d", i))
			e.Start()
			leads = append(leads, e)
			numbers = append(numbers, i)
			elections[m.ID] = append(elections[m.ID], e)
		}
		r := jobs.NewRunner(spec, s.Client(), leads, numbers, jobs.Config{Instance: m.ID, Logger: zaptest.NewLogger(t).Named(m.ID)})
		r.Start()
		t.Cleanup(r.Stop)
	}
	count := func() map[int]map[time.Time]int {
		per := make(map[int]map[time.Time]int)
		for _, r := range runs {
			if per[r.Shard] == nil {
				per[r.Shard] = make(map[time.Time]int)
			}
			per[r.Shard][r.Slot]++
		}
		return per
	}
	f.Await("five slots of every shard", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		per := count()
		for i := range shards {
			if len(per[i]) < 5 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for shard, slots := range count() {
		for slot, n := range slots {
			if n > 1 {
				t.Errorf("shard %d: slot %s ran %d times", shard, slot, n)
			}
		}
	}
	for _, r := range runs {
		e := elections[r.Instance][r.Shard]
		if term := e.Term(); !term.Holds() || term.Token != r.Token || r.Election != e.Name() {
			t.Errorf("shard %d ran on %s under token %d in %s; that instance's term there: holds %v, token %d",
				r.Shard, r.Instance, r.Token, r.Election, term.Holds(), term.Token)
		}
	}
}

func TestAFinishTheStoreMissedIsRecordedByTheSameInstancesNextTerm(t *testing.T) {
	t.Parallel()
	svc := newService(t) // fails the test if the slot is finished twice
	release := make(chan struct{})
	held := svc.holdFirst(func(context.Context) error {
		<-release // finishes whatever becomes of its term
		return nil
	})
	f := startJobFleet(t, 1, jobs.Spec{Name: "sweep", Schedule: jobs.Every(300 * time.Millisecond), Action: svc.action}, jobs.Events{})
	leader, token := f.Leader(3 * ttl)
	svc.await("the first run", 5*time.Second, func() bool { return len(svc.runs) == 1 })
	// The service finishes the run, but the store refuses its finish, and the term ends.
	f.clients[0].Fail("PutJobRecord", -1, errors.New("store unreachable"))
	f.store.Delete(leader.Election.Name())
	close(release)
	f.NewLeader(nil, token, 3*ttl)
	f.clients[0].Fail("PutJobRecord", 0, nil)
	// The next term records the finish it knows of and goes on with the next slots; the
	// service fails the test if the slot is run to its end again.
	svc.await("a later slot", 5*time.Second, func() bool {
		return len(svc.ended) > 1 && svc.ended[len(svc.ended)-1].Slot.After(held().Slot)
	})
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for _, r := range svc.runs[1:] {
		if r.Slot.Equal(held().Slot) {
			t.Errorf("slot %s ran again under token %d, though this instance ran it to its end", r.Slot, r.Token)
		}
	}
}
