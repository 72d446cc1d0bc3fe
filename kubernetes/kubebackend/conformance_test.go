package kubebackend

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// TestConformance runs the store-neutral suite against a real kube-apiserver.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	srv := kubetest.Start(t, kubetest.Options{})
	kubeconfig := srv.Kubeconfig(t, "admin", "default", "")
	var n atomic.Int64
	electortest.Run(t, func(t *testing.T) electortest.Harness {
		return electortest.Harness{
			NewClient: func(t *testing.T) elector.Backend {
				b, err := New(Config{Kubeconfig: kubeconfig, Prefix: "conformance-"})
				if err != nil {
					t.Fatal(err)
				}
				return b
			},
			TTL:      2 * time.Second,
			Advance:  time.Sleep,
			Election: func() string { return fmt.Sprintf("Conformance.%d", n.Add(1)) },
		}
	})
}
