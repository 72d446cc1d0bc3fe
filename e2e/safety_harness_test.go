//go:build unix

package e2e

import (
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// The safety checker, its recording backend, load and scenario runner are internal/testkit/safety,
// which every store's end-to-end tests share; the names below keep the tests short. A
// scenario's store is the etcd cluster of real processes (nil on PostgreSQL, whose faults
// reach the server they are given).
type (
	safetyEnv        = safety.Env[*etcdProcs]
	scenarioRun      = safety.Run[*etcdProcs]
	safetyScenario   = safety.Scenario[*etcdProcs]
	safetyReport     = safety.Report
	outcome          = safety.Outcome
	arrival          = safety.Arrival
	loadRun          = safety.LoadRun
	recordingBackend = safety.Backend
)

// resultsTable gathers the reports of a test's scenarios, which may run side by side
// (t.Parallel), one row per scenario in the order the rows were taken.
type resultsTable struct {
	mu   sync.Mutex
	rows []*safetyReport // nil: the scenario ended without a report
}

// startResults returns t's results table, which t logs under "RESULTS (heading; time in
// all)" once every scenario has ended (t.Cleanup runs after t's parallel subtests).
func startResults(t *testing.T, heading string) *resultsTable {
	started := time.Now()
	r := &resultsTable{}
	t.Cleanup(func() {
		t.Logf("RESULTS (%s; %v in all):%s", heading, time.Since(started).Round(time.Second), safety.Table(r.reports()))
	})
	return r
}

// row takes the table's next row, before the scenario starts so that the rows keep the
// scenarios' order, and returns what fills it with the scenario's report.
func (r *resultsTable) row() func(safetyReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := len(r.rows)
	r.rows = append(r.rows, nil)
	return func(rep safetyReport) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.rows[i] = &rep
	}
}

func (r *resultsTable) reports() []safetyReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	var reps []safetyReport
	for _, rep := range r.rows {
		if rep != nil {
			reps = append(reps, *rep)
		}
	}
	return reps
}
