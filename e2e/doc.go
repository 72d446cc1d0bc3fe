// Package e2e tests caddy-leader end to end: real Caddy processes built from this module
// against a real etcd cluster, with real faults.
//
// The harness is internal/testkit/fleet, which the demo and the benchmarks share; harness_test.go
// gives its pieces the short names the tests use. TestMain builds the Caddy binary of
// ./cmd/caddy once; every scenario starts its own etcd cluster (embedded in the test
// process, on 127.0.0.1) and its own Caddy processes, each with its own loopback ports and
// temporary directories, and kills them all when it ends. Faults
// are real: SIGKILL, SIGTERM, SIGSTOP/SIGCONT, stopped etcd members, a blackholed link, a
// deleted election key. Every wait has an explicit, generous bound; nothing asserts speed
// beyond such bounds.
//
// The package needs a Unix system and the go command; `go test -short` skips it. Setting
// E2E_CADDY_RACE=1 builds the Caddy binary with the race detector, so that the plugin's
// code, which runs in the Caddy processes and not in the test process, is checked too.
package e2e
