// Package browser tests the status page in headless Chromium and the Grafana dashboard's
// queries against a real Prometheus, both on a real fleet of Caddy processes on etcd.
package browser
