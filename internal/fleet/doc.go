// Package fleet starts and drives real caddy-leader processes on 127.0.0.1 (Caddy
// instances, etcd-local members), asks them who leads and times takeovers; the e2e tests,
// the benchmarks and the demo share it.
package fleet
