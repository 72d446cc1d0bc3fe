//go:build bench && unix

package e2e

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

var benchProfile = flag.String("bench.profile", "", "write a CPU profile of the first instance over each window of instance costs, and a heap profile at its end, to this directory (files named after the test)")

// instanceCost is what an idle instance costs its machine over a window: CPU (percent of
// one core), and at the window's end its goroutines (as Caddy's admin /debug/pprof/ counts
// them) and its live heap (/debug/vars' memstats).
type instanceCost struct {
	cpu        float64
	goroutines int
	heapBytes  uint64
}

// clockTicks is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// processTicks is the CPU time pid has used, user and system, in clock ticks.
func processTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name (field 2) may hold spaces; the fields after its ")" are plain.
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseInt(rest[11], 10, 64) // field 14
	stime, _ := strconv.ParseInt(rest[12], 10, 64) // field 15
	return utime + stime
}

// goroutines is the instance's goroutine count from its admin API's goroutine profile.
func goroutines(t *testing.T, in *fleet.Instance) int {
	t.Helper()
	resp, err := in.Admin(http.MethodGet, "/debug/pprof/goroutine?debug=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(resp.Body, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		t.Fatalf("%s: goroutine profile begins %q", in.ID, first)
	}
	return n
}

// heapInUse is the instance's live heap, from its admin API's /debug/vars.
func heapInUse(t *testing.T, in *fleet.Instance) uint64 {
	t.Helper()
	resp, err := in.Admin(http.MethodGet, "/debug/vars", nil)
	if err != nil {
		t.Fatal(err)
	}
	var vars struct {
		Memstats struct{ HeapAlloc uint64 } `json:"memstats"`
	}
	if err := json.Unmarshal([]byte(resp.Body), &vars); err != nil {
		t.Fatalf("%s: /debug/vars: %v", in.ID, err)
	}
	return vars.Memstats.HeapAlloc
}

// measureInstances runs window (which should take the whole measured time) and returns
// each instance's cost over it.
func measureInstances(t *testing.T, instances []*fleet.Instance, window func()) []instanceCost {
	t.Helper()
	before := make([]int64, len(instances))
	for i, in := range instances {
		before[i] = processTicks(t, in.Process().Pid())
	}
	start := time.Now()
	profiled := profileFirst(t, instances[0])
	window()
	<-profiled
	heapProfileFirst(t, instances[0])
	elapsed := time.Since(start).Seconds()
	costs := make([]instanceCost, len(instances))
	for i, in := range instances {
		used := float64(processTicks(t, in.Process().Pid())-before[i]) / clockTicks
		costs[i] = instanceCost{cpu: 100 * used / elapsed, goroutines: goroutines(t, in), heapBytes: heapInUse(t, in)}
	}
	return costs
}

// profileFirst writes a CPU profile of in over the next -bench.idle.window less a second
// into -bench.profile, if given; the channel closes once it is written.
func profileFirst(t *testing.T, in *fleet.Instance) <-chan struct{} {
	done := make(chan struct{})
	if *benchProfile == "" {
		close(done)
		return done
	}
	secs := max(1, int(benchIdleWindow.Seconds())-1)
	path := filepath.Join(*benchProfile, strings.ReplaceAll(t.Name(), "/", "_")+".prof")
	go func() {
		defer close(done)
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", in.AdminPort, secs))
		if err != nil {
			t.Errorf("profile of %s: %v", in.ID, err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(path)
		if err != nil {
			t.Errorf("profile of %s: %v", in.ID, err)
			return
		}
		defer f.Close()
		if _, err := io.Copy(f, resp.Body); err != nil {
			t.Errorf("profile of %s: %v", in.ID, err)
		}
	}()
	return done
}

// heapProfileFirst writes a heap profile of in into -bench.profile, if given.
func heapProfileFirst(t *testing.T, in *fleet.Instance) {
	if *benchProfile == "" {
		return
	}
	path := filepath.Join(*benchProfile, strings.ReplaceAll(t.Name(), "/", "_")+".heap")
	resp, err := in.Admin(http.MethodGet, "/debug/pprof/heap", nil)
	if err == nil {
		err = os.WriteFile(path, []byte(resp.Body), 0o644)
	}
	if err != nil {
		t.Errorf("heap profile of %s: %v", in.ID, err)
	}
}

// meanCost is the instances' mean cost, with the highest CPU among them.
func meanCost(costs []instanceCost) (mean instanceCost, maxCPU float64) {
	for _, c := range costs {
		mean.cpu += c.cpu / float64(len(costs))
		mean.goroutines += c.goroutines
		mean.heapBytes += c.heapBytes
		maxCPU = max(maxCPU, c.cpu)
	}
	mean.goroutines /= len(costs)
	mean.heapBytes /= uint64(len(costs))
	return mean, maxCPU
}

// String gives the instances' cost as the bench logs it.
func costLine(costs []instanceCost) string {
	mean, maxCPU := meanCost(costs)
	return fmt.Sprintf("per instance: CPU %.1f %% of a core (max %.1f %%), %d goroutines, heap %.1f MiB",
		mean.cpu, maxCPU, mean.goroutines, float64(mean.heapBytes)/(1<<20))
}
