package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/jobrec"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
	"github.com/caddyleader/caddy-leader/kubernetes/kubebackend"
)

// TestJobsUnderFaults is the root's jobrec.Faults on this store: a job every second on three
// Caddy processes on a real kube-apiserver, a fault while the leader's run is under way
// (an operator's delete clears the election Lease's holder, as `kubectl edit` would), and
// the service's record of every run checked.
func TestJobsUnderFaults(t *testing.T) {
	needCaddy(t)
	srv := kubetest.Start(t, kubetest.Options{})
	fleets := 0
	jobrec.Faults(t, caddyBin, func(t *testing.T) *jobrec.Store {
		fleets++
		prefix := fmt.Sprintf("jobs%d", fleets)
		s := &jobrec.Store{Proxies: jobrec.Proxies(t, strings.TrimPrefix(srv.URL, "https://"))}
		s.Config = fleet.Config{InstanceStore: map[string]map[string]any{}}
		for id, p := range s.Proxies {
			s.Config.InstanceStore[id] = map[string]any{"module": "kubernetes",
				"kubeconfig": srv.Kubeconfig(t, "admin", "default", "https://"+p.Addr()), "lease_prefix": prefix + "-"}
		}
		s.Config.Store = s.Config.InstanceStore["c0"]
		s.DeleteKey = func(t *testing.T) { clearElectionHolder(t, srv, prefix+"-default-") }
		s.Stop = func(t *testing.T) { srv.Stop(t) }
		s.Start = func(t *testing.T) { srv.Start(t) }
		return s
	})
}

// clearElectionHolder clears the holder of the election Lease whose name starts with
// prefix, as an operator's `kubectl edit` would.
func clearElectionHolder(t *testing.T, srv *kubetest.Server, prefix string) {
	t.Helper()
	rc, _, err := kubebackend.RESTConfig(srv.Kubeconfig(t, "admin", "default", ""))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := clientset.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	leases := cs.CoordinationV1().Leases("default")
	ctx := context.Background()
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: "caddy-leader.io/kind=election"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Items {
		if !strings.HasPrefix(l.Name, prefix) {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := leases.Get(ctx, l.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.HolderIdentity = nil
			_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no election Lease named %s*", prefix)
}
