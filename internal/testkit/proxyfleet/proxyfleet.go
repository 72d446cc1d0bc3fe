// Package proxyfleet starts a fleet of in-process candidates (elector/electortest) whose
// members each reach a real store through a fault proxy of their own, for the stores'
// election tests.
package proxyfleet

import (
	"testing"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/internal/testkit/faultproxy"
)

// Fleet is an electortest fleet and member i's proxy at Proxies[i].
type Fleet struct {
	*electortest.Fleet
	Proxies []*faultproxy.Proxy
}

// Start starts o's fleet (o.Backend is replaced): member i reaches target (host:port)
// through a proxy of its own, whose address backend turns into that member's backend. When
// the test ends, the links heal before the candidates close (cleanups run last-in first-out).
func Start(t *testing.T, o electortest.FleetOptions, target string, backend func(t testing.TB, i int, addr string) elector.Backend) *Fleet {
	t.Helper()
	f := &Fleet{}
	o.Backend = func(t testing.TB, i int) elector.Backend {
		p, err := faultproxy.New(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		f.Proxies = append(f.Proxies, p)
		return backend(t, i, p.Addr())
	}
	f.Fleet = electortest.StartFleet(t, o)
	t.Cleanup(func() {
		for _, p := range f.Proxies {
			p.Heal()
		}
	})
	return f
}

// Index is m's position in the fleet, and so in Proxies; -1 if it is not a member.
func (f *Fleet) Index(m *electortest.Member) int {
	for i, x := range f.Members {
		if x == m {
			return i
		}
	}
	return -1
}

// Proxy is m's link to the store.
func (f *Fleet) Proxy(m *electortest.Member) *faultproxy.Proxy { return f.Proxies[f.Index(m)] }
