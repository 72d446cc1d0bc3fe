//go:build bench && unix

package e2e

// TestBenchJobs measures a scheduled job on three Caddy processes on etcd: how late each run
// reaches the service after its slot on a steady leader, and what the job adds to the
// store's writes per slot, against the same fleet without the job, measured in the same run.
//
//	go test -tags bench -run TestBenchJobs -v -timeout 20m ./e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/jobrec"
)

func TestBenchJobs(t *testing.T) {
	needCaddy(t)
	const (
		every  = 200 * time.Millisecond
		window = 30 * time.Second
	)
	// measure runs a fleet, with the job if withJob, and counts the revisions it makes
	// over the window, per second, and the runs the service saw then.
	measure := func(t *testing.T, withJob bool) (float64, []jobrec.Run) {
		etcd := etcdtest.Start(t, 1)
		svc := jobrec.Start(t, 0)
		cfg := Config{Endpoints: etcd.Endpoints()}
		if withJob {
			cfg.Jobs = map[string]any{"tick": map[string]any{"every": every.String(), "request": map[string]any{"method": "POST", "url": svc.URL}}}
		}
		fleet := StartFleet(t, 3, cfg)
		WaitStableLeader(t, fleet, electTimeout)
		time.Sleep(3 * time.Second) // the first term's settle and announcements
		cli := etcd.Client(t)
		ctx := context.Background()
		first, err := cli.Get(ctx, "\x00", clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		from := time.Now()
		time.Sleep(window)
		last, err := cli.Get(ctx, "\x00", clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		runs := slices.DeleteFunc(svc.Runs(), func(r jobrec.Run) bool { return r.Start.Before(from) })
		return float64(last.Header.Revision-first.Header.Revision) / window.Seconds(), runs
	}
	var without, with float64
	var runs []jobrec.Run
	t.Run("without_a_job", func(t *testing.T) { without, _ = measure(t, false) })
	t.Run("with_a_job", func(t *testing.T) { with, runs = measure(t, true) })
	slotsPerSecond := float64(time.Second) / float64(every)
	p50, p99 := lateness(runs)
	t.Logf("MEASURED store writes: %.2f/s without a job, %.2f/s with a job every %v: %.2f writes per slot", without, with, every, (with-without)/slotsPerSecond)
	t.Logf("MEASURED %d runs on a steady leader, lateness after the slot: p50 %v, p99 %v (max %v)", len(runs), p50, p99, slices.Max(jobrec.Lateness(runs)))
}

// lateness is the p50 and p99 of how late runs reached the service after their slots.
func lateness(runs []jobrec.Run) (p50, p99 time.Duration) {
	late := jobrec.Lateness(runs)
	slices.Sort(late)
	if len(late) == 0 {
		return 0, 0
	}
	return late[len(late)/2], late[len(late)*99/100]
}
