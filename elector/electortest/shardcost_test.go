package electortest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/shards"
)

// BenchmarkShardSetCost measures what a shard set costs today, shard by shard, on the
// in-memory store (which costs nothing itself): a fleet of 5 instances, each running a set
// of S shards placed as the leader app places them (see shardSet in the root package), ttl
// 2 s. It is the baseline the set's redesign (issue 35) is compared with; see
// BENCHMARKS.md, "Where a shard's cost goes today". Every phase is bounded in time: a set
// that does not place or move within its bound reports how far it got.
//
//	go test -run '^$' -bench ShardSetCost -benchtime 1x -count 3 ./elector/electortest/
func BenchmarkShardSetCost(b *testing.B) {
	if testing.Short() {
		b.Skip("starts thousands of elections for seconds")
	}
	for _, s := range []int{64, 256, 1024, 4096} {
		b.Run("shards="+strconv.Itoa(s), func(b *testing.B) {
			var sum shardCost
			for range b.N {
				sum.add(measureShardSet(b, 5, s))
			}
			sum.report(b, b.N)
		})
	}
}

// Bounds of the phases of one measurement.
const (
	costTTL       = 2 * time.Second
	costPlaceWait = 60 * time.Second
	costIdle      = 3 * time.Second
	costMoveWait  = 30 * time.Second
)

// shardCost is one measurement of a fleet's shard set, per shard (and per instance where
// said).
type shardCost struct {
	goroutines   float64 // per instance and shard, once placed
	heap         float64 // bytes per instance and shard, once placed
	stacks       float64 // bytes of goroutine stacks per instance and shard, once placed
	placed       float64 // shards at their preferred owner when placement ended
	placeCalls   float64 // store calls until then, per instance and shard
	placeSeconds float64
	idleCalls    float64 // store calls of the fleet per second and shard, once placed
	idleCPU      float64 // percent of one core per instance, once placed (the store's own included)
	moved        float64 // shards the leaving instance held
	movedLed     float64 // of which led by another instance when the move ended
	moveCalls    float64 // store calls of the fleet per shard moved
	moveMillis   float64 // until the last moved shard was led elsewhere
}

func (c *shardCost) add(o shardCost) {
	c.goroutines += o.goroutines
	c.heap += o.heap
	c.stacks += o.stacks
	c.placed += o.placed
	c.placeCalls += o.placeCalls
	c.placeSeconds += o.placeSeconds
	c.idleCalls += o.idleCalls
	c.idleCPU += o.idleCPU
	c.moved += o.moved
	c.movedLed += o.movedLed
	c.moveCalls += o.moveCalls
	c.moveMillis += o.moveMillis
}

func (c *shardCost) report(b *testing.B, n int) {
	for _, m := range []struct {
		v    float64
		unit string
	}{
		{c.goroutines, "goroutines/inst/shard"},
		{c.heap, "heapB/inst/shard"},
		{c.stacks, "stackB/inst/shard"},
		{c.placed, "placed"},
		{c.placeCalls, "start-calls/inst/shard"},
		{c.placeSeconds, "place-s"},
		{c.idleCalls, "idle-calls/s/shard"},
		{c.idleCPU, "idle-cpu%/inst"},
		{c.moved, "moved"},
		{c.movedLed, "moved-led"},
		{c.moveCalls, "move-calls/shard"},
		{c.moveMillis, "move-ms"},
	} {
		b.ReportMetric(m.v/float64(n), m.unit)
	}
}

// costFleet is the instances of one measurement, each with its set's elections in shard
// order.
type costFleet struct {
	ids   []string
	cands []*elector.Candidate
	sets  [][]*elector.Election
}

// measureShardSet starts n instances with a set of count shards each on a fresh store and
// measures them through placement, idleness and the departure of one instance.
func measureShardSet(b *testing.B, n, count int) shardCost {
	b.StopTimer()
	store := NewStore()
	stopClock := store.RunClock(b, 10*time.Millisecond)
	defer stopClock()
	baseGoroutines := goroutinesByFunction()
	baseMem := memInUse()
	running := runtime.NumGoroutine()

	b.StartTimer()
	f := startCostFleet(b, store, n, count)
	defer f.close(running)
	var c shardCost
	start := time.Now()
	preferred := preferredOwners(f.ids, count)
	placed := waitFor(costPlaceWait, func() int { return f.atPreferred(preferred) }, count)
	c.placeSeconds = time.Since(start).Seconds()
	c.placed = float64(placed)
	startCalls := store.Calls()
	c.placeCalls = float64(totalCalls(startCalls)) / float64(n*count)
	b.StopTimer()
	b.Logf("%d shards: %d placed in %s; calls by method until then: %v", count, placed, time.Since(start).Round(time.Millisecond), startCalls)

	shardsRun := float64(n * count)
	mem := memInUse()
	c.heap = float64(mem.heap-baseMem.heap) / shardsRun
	c.stacks = float64(mem.stacks-baseMem.stacks) / shardsRun
	after := goroutinesByFunction()
	grown := 0
	for fn, k := range after {
		grown += k - baseGoroutines[fn]
	}
	c.goroutines = float64(grown) / shardsRun
	logGoroutines(b, baseGoroutines, after, shardsRun)

	before, cpuBefore := store.Calls(), processCPU()
	idleStart := time.Now()
	time.Sleep(costIdle) // a window of idleness, measured, not a condition awaited
	idle := diffCalls(store.Calls(), before)
	window := time.Since(idleStart)
	c.idleCalls = float64(totalCalls(idle)) / window.Seconds() / float64(count)
	c.idleCPU = 100 * float64(processCPU()-cpuBefore) / float64(window) / float64(n)
	b.Logf("%d shards: idle calls by method over %s: %v", count, costIdle, idle)

	c.moved, c.movedLed, c.moveCalls, c.moveMillis = f.leave(b, store, 0)
	b.StartTimer()
	return c
}

// startCostFleet starts n instances, each in every shard of a set named "rooms" of count
// shards, as the root package's shardSet and startShardSet do.
func startCostFleet(b *testing.B, store *Store, n, count int) *costFleet {
	f := &costFleet{}
	for i := range n {
		id := fmt.Sprintf("node-%d", i)
		c, err := elector.NewCandidate(elector.Config{
			ID: id, URL: "http://" + id + ".test:8080", TTL: costTTL, DrainTimeout: time.Second,
			Backend: store.BatchingClient(), Logger: zap.NewNop(), Now: store.Now, // batches, as etcd and PostgreSQL do
		})
		if err != nil {
			b.Fatal(err)
		}
		slots := make(chan struct{}, 4) // the leader app's default max_moves
		c.GroupHeartbeats("rooms")
		summary := c.MoveLog("rooms", count)
		set := make([]*elector.Election, count)
		for s := range set {
			e := c.Election(shardName(s))
			shard := s
			e.SetPlacement(func(id string, priority int) float64 { return shards.Score(id, shard, priority) }, slots)
			e.ShareRegistry("rooms")
			e.SetMoveLog(summary)
			set[s] = e
		}
		c.Start()
		for _, e := range set {
			e.Start()
		}
		f.ids, f.cands, f.sets = append(f.ids, id), append(f.cands, c), append(f.sets, set)
	}
	return f
}

// close closes every instance, then waits (within a bound) until the process is back to
// the goroutines it ran before the fleet: the store's watches end a moment after Close
// returns, and the next measurement's baseline must not count what they still hold.
func (f *costFleet) close(goroutines int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range f.cands {
		_ = c.Close(ctx)
	}
	waitFor(10*time.Second, func() int { return -runtime.NumGoroutine() }, -goroutines)
}

// preferredOwners is each shard's preferred owner among ids, all of the default priority.
func preferredOwners(ids []string, count int) []string {
	list := make([]shards.Candidate, len(ids))
	for i, id := range ids {
		list[i] = shards.Candidate{ID: id, Weight: elector.DefaultPriority}
	}
	return shards.Placement(count, list)
}

// atPreferred counts the shards whose preferred owner admits and no other instance does.
func (f *costFleet) atPreferred(preferred []string) int {
	placed := 0
	for s, want := range preferred {
		var leaders []string
		for i, set := range f.sets {
			if _, ok := set[s].Check(); ok {
				leaders = append(leaders, f.ids[i])
			}
		}
		if len(leaders) == 1 && leaders[0] == want {
			placed++
		}
	}
	return placed
}

// leave makes instance i leave as a SIGTERM does (Leave), and measures the move of the
// shards it held: how many, how many another instance led within the bound, the fleet's
// store calls per shard moved until then and how long the last one took.
func (f *costFleet) leave(b *testing.B, store *Store, i int) (moved, led, calls, millis float64) {
	var held []int
	for s, e := range f.sets[i] {
		if _, ok := e.Check(); ok {
			held = append(held, s)
		}
	}
	if len(held) == 0 {
		return 0, 0, 0, 0
	}
	ledElsewhere := func() int {
		n := 0
		for _, s := range held {
			for j, set := range f.sets {
				if _, ok := set[s].Check(); ok && j != i {
					n++
					break
				}
			}
		}
		return n
	}
	before := store.Calls()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), costMoveWait)
	defer cancel()
	left := make(chan error, 1)
	go func() { left <- f.cands[i].Leave(ctx) }()
	n := waitFor(costMoveWait, ledElsewhere, len(held))
	elapsed := time.Since(start)
	moveCalls := diffCalls(store.Calls(), before)
	if err := <-left; err != nil {
		b.Logf("Leave: %v", err)
	}
	b.Logf("%d shards: calls by method while %d shards moved (%d led elsewhere, %s): %v",
		len(f.sets[i]), len(held), n, elapsed, moveCalls)
	return float64(len(held)), float64(n), float64(totalCalls(moveCalls)) / float64(len(held)),
		float64(elapsed) / float64(time.Millisecond)
}

// waitFor polls count until it reaches want or within has passed, and returns its last
// value.
func waitFor(within time.Duration, count func() int, want int) int {
	deadline := time.Now().Add(within)
	for {
		n := count()
		if n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func totalCalls(calls map[string]int64) int64 {
	var n int64
	for _, k := range calls {
		n += k
	}
	return n
}

func diffCalls(after, before map[string]int64) map[string]int64 {
	out := make(map[string]int64)
	for op, n := range after {
		if d := n - before[op]; d != 0 {
			out[op] = d
		}
	}
	return out
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// memory is what the process holds after a collection: its live heap and its goroutines'
// stacks.
type memory struct{ heap, stacks int64 }

// memInUse is the memory the process holds after a collection. The heap leaves out the
// runtime's descriptor of each goroutine (a few hundred bytes), which it keeps for reuse
// once the goroutine ends, and what else the process keeps once a fleet has run: the
// first measurement of a size counts it, later ones do not (see BENCHMARKS.md).
func memInUse() memory {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memory{heap: int64(m.HeapAlloc), stacks: int64(m.StackInuse)}
}

// goroutinesByFunction counts the goroutines of the process by the function each one
// started in (the outermost frame of its stack in the goroutine profile).
func goroutinesByFunction() map[string]int {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	out := make(map[string]int)
	count, entry := 0, ""
	flush := func() {
		if count > 0 {
			out[entry] += count
		}
		count, entry = 0, ""
	}
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, " @ "):
			flush()
			count, _ = strconv.Atoi(strings.Fields(line)[0])
		case strings.HasPrefix(line, "#\t"):
			if f := strings.Fields(line); len(f) >= 3 {
				entry, _, _ = strings.Cut(f[2], "+0x")
			}
		}
	}
	flush()
	return out
}

// logGoroutines logs the goroutines the fleet added, by the function they started in,
// per instance and shard, most first.
func logGoroutines(b *testing.B, before, after map[string]int, shardsRun float64) {
	grown := make(map[string]int)
	for fn, n := range after {
		if d := n - before[fn]; d > 0 {
			grown[fn] = d
		}
	}
	fns := slices.SortedFunc(maps.Keys(grown), func(x, y string) int { return grown[y] - grown[x] })
	var sb strings.Builder
	for _, fn := range fns {
		fmt.Fprintf(&sb, "\n  %7.3f  %6d  %s", float64(grown[fn])/shardsRun, grown[fn], fn)
	}
	b.Logf("goroutines added, per instance and shard, total, by the function they run:%s", sb.String())
}
