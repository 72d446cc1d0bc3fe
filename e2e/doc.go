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
// Scenarios that start a world of their own (store servers, a fleet, fault proxies, ports
// from freeport, which never hands out a port twice in a process) run side by side: they
// spend most of their time waiting for ttls to pass. The subtests of such a test call
// t.Parallel, and so do a few top-level tests, which go test runs together once the others
// are done. At most -parallel of them run at once: GOMAXPROCS by default, two on two cores;
// -parallel 1 runs them one at a time. Tests whose leaders ride a failsafe run alone
// nonetheless: every round of the failsafe's questions must be answered within ttl/4.
//
// The package needs a Unix system and the go command; `go test -short` skips it. Setting
// E2E_CADDY_RACE=1 builds the Caddy binary with the race detector, so that the plugin's
// code, which runs in the Caddy processes and not in the test process, is checked too.
package e2e
