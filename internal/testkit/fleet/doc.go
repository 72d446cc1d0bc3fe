// Package fleet runs caddy-leader fleets for the e2e tests, the benchmarks and the demo:
// real processes on 127.0.0.1 (Caddy instances, etcd-local) or elector candidates in the
// caller's own process; it asks them who leads and times takeovers.
package fleet
