// Package e2e tests the layer-4 modules with real processes on loopback: Caddy instances
// built from l4/cmd/caddy, each in front of its own redis-server, electing through etcd.
package e2e
