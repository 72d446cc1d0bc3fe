// Package testkit is the test kit's folder: real stores (etcdtest, pgtest), fault injection
// (faultproxy), fleets of real Caddy processes (fleet, proxyfleet), the safety checker and
// the failover benchmark (safety, failover), golden files and reports. None of it ships: the
// running server imports only internal/termconn from internal/.
package testkit
