//go:build unix

package e2e

import "github.com/caddyleader/caddy-leader/internal/testkit/safety"

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
