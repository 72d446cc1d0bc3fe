package kubernetes

// TestSafety is the safety checker of the root's e2e tests (internal/testkit/safety) on this store,
// with real Caddy processes (cmd/caddy) on a real kube-apiserver, in every follower mode:
//
//	cd kubernetes && go test -count=1 -v -run TestSafety .
//
// One API server serves the three modes (a lease prefix each). Each mode runs one fleet of
// four instances through the faults in turn, each striking the leader of the moment: those
// that leave the victim running first, SIGTERM and SIGKILL last. Each instance reaches the
// API server through a fault proxy of its own. The faults that strike the API server itself
// (a restart, a restore of its etcd) run once, in forward mode. Only each fault's own
// arrivals are checked: 0 double admissions by admission time and by token, and a leader
// that takes over.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/util/retry"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
	"github.com/caddyleader/caddy-leader/kubernetes/kubebackend"
)

type (
	kubeEnv      = safety.Env[*kubetest.Server]
	kubeRun      = safety.Run[*kubetest.Server]
	kubeScenario = safety.Scenario[*kubetest.Server]
)

const (
	// safetyInstances is each mode's fleet: four, so that two are left after SIGTERM and
	// SIGKILL have each taken one.
	safetyInstances = 4
	// safetyRate is the clients' requests per second.
	safetyRate = 60
	// safetyWarmup is how long the clients send before each fault.
	safetyWarmup = 700 * time.Millisecond
	// safetyTTL is the fleet's lease ttl.
	safetyTTL = 2 * time.Second
)

func TestSafety(t *testing.T) {
	needCaddy(t)
	started := time.Now()
	srv := kubetest.Start(t, kubetest.Options{})
	var reports []safety.Report
	defer func() {
		t.Logf("RESULTS (ttl %v, %d instances, kube-apiserver, %d req/s; %v in all):%s", safetyTTL, safetyInstances, safetyRate, time.Since(started).Round(time.Second), safety.Table(reports))
	}()
	for _, mode := range []string{"reject", "redirect", "forward"} {
		t.Run(mode, func(t *testing.T) {
			env := startKubeEnv(t, srv, mode)
			for _, sc := range kubeScenarios(mode) {
				sc.Name = mode + "_" + sc.Name
				sc.Warmup, sc.Rate = safetyWarmup, safetyRate
				if !t.Run(sc.Name, func(t *testing.T) {
					env.T = t
					reports = append(reports, safety.RunOn(t, env, sc))
				}) {
					return // the fleet's state is unknown: the next faults would tell nothing
				}
			}
		})
	}
}

// startKubeEnv starts mode's fleet on srv, each instance through a fault proxy of its own
// and under a lease prefix of the mode's, and waits for a leader.
func startKubeEnv(t *testing.T, srv *kubetest.Server, mode string) *kubeEnv {
	t.Helper()
	return startKubeEnvN(t, srv, mode, mode, safetyInstances)
}

// kubeScenarios are the faults, in the order one fleet goes through them.
func kubeScenarios(mode string) []kubeScenario {
	list := []kubeScenario{
		{Name: "leader_cut_off_from_the_api_server_2ttl", Load: 6 * time.Second, Change: safety.MustChange, Fault: func(s *kubeRun) {
			s.Cut(s.Leader)
			time.Sleep(2 * safetyTTL)
			s.Heal(s.Leader)
		}},
		{Name: "sigstop_leader_2ttl_then_sigcont", Load: 7 * time.Second, Frozen: true, Change: safety.MustChange, Fault: safety.SigstopFault[*kubetest.Server]},
		// An operator's edit and delete strike while the leader's link is slow, so that it
		// hears late of them (safety.OperatorFault).
		{Name: "election_lease_holder_cleared_by_an_operator", Load: 6 * time.Second, Change: safety.MustChange, Fault: safety.OperatorFault(false, func(s *kubeRun) error {
			return editElection(s, mode, func(l *coordv1.Lease) { l.Spec.HolderIdentity = nil })
		})},
		{Name: "election_lease_deleted_by_an_operator", Load: 6 * time.Second, Change: safety.MustChange, Fault: safety.OperatorFault(false, func(s *kubeRun) error {
			leases, name := electionLease(s, mode)
			return leases.Delete(context.Background(), name, metav1.DeleteOptions{})
		})},
		{Name: "resign_on_the_leader", Load: 3 * time.Second, Change: safety.MustChange, NoErrors: mode == "forward", Fault: func(s *kubeRun) {
			admin(s, s.Leader, "/leader/default/resign?hold_off=2s")
		}},
		{Name: "transfer_asked_of_a_follower", Load: 3 * time.Second, Change: safety.MustChange, NoErrors: mode == "forward", Fault: func(s *kubeRun) {
			rest := fleet.Others(s.Fleet, s.Leader)
			admin(s, rest[0], "/leader/default/transfer?timeout=10s&to="+rest[1].ID)
		}},
	}
	if mode == "forward" {
		list = append(list,
			kubeScenario{Name: "api_server_restarted", Load: 14 * time.Second, Change: safety.MayChange, Fault: func(s *kubeRun) {
				s.Store.Stop(s.T)
				s.Mark("stopped")
				s.Store.Start(s.T)
				s.Notes = append(s.Notes, fmt.Sprintf("API server back %s after the fault", safety.FmtDur(time.Since(s.FaultAt))))
			}},
			kubeScenario{Name: "etcd_restored_to_before_the_last_handover", Load: 16 * time.Second, Change: safety.MustChange, Fault: restoreFault},
		)
	}
	return append(list,
		kubeScenario{Name: "sigterm_leader", Load: 3 * time.Second, Change: safety.MustChange, NoErrors: mode == "forward", Fault: func(s *kubeRun) {
			s.Survivors = fleet.Others(s.Fleet, s.Leader)
			s.Load.MarkDown(s.Leader)
			s.Leader.Term()
		}},
		kubeScenario{Name: "sigkill_leader", Load: 5 * time.Second, Change: safety.MustChange, Fault: func(s *kubeRun) {
			s.Survivors = fleet.Others(s.Fleet, s.Leader)
			s.Leader.Kill()
		}},
	)
}

// restoreFault snapshots the API server's etcd, lets the leader resign so that another term
// begins, and then restores the snapshot as an operator does (`etcdutl snapshot restore
// --bump-revision --mark-compacted`, the API server stopped): the store comes back with
// the older term, its token below the one the fleet has seen.
func restoreFault(s *kubeRun) {
	snap := s.Store.Etcd.Snapshot(s.T)
	admin(s, s.Leader, "/leader/default/resign?hold_off=2s")
	next, token := fleet.WaitStableLeader(s.T, s.Fleet, safety.RecoverTimeout)
	s.Notes = append(s.Notes, fmt.Sprintf("%s:%d led before the restore", next, token))
	s.Store.Stop(s.T)
	s.Mark("stopped")
	s.Store.Etcd.Restore(s.T, snap, etcdtest.RestoreOptions{RevisionBump: 1_000_000, MarkCompacted: true})
	s.Store.Start(s.T)
	s.Notes = append(s.Notes, fmt.Sprintf("API server back %s after the fault", safety.FmtDur(time.Since(s.FaultAt))))
}

// admin sends a POST to in's admin API and fails the scenario unless it is answered 200.
func admin(s *kubeRun, in *fleet.Instance, path string) {
	s.T.Helper()
	if resp, err := in.Admin(http.MethodPost, path, nil); err != nil || resp.Status != http.StatusOK {
		s.T.Fatalf("POST %s to %s: %v %d %s", path, in, err, resp.Status, resp.Body)
	}
}

// electionLease finds mode's election Lease as an operator would (`kubectl get leases -l
// caddy-leader.io/kind=election`), with the admin's client, and returns the client and
// the Lease's name.
func electionLease(s *kubeRun, mode string) (coordclient.LeaseInterface, string) {
	s.T.Helper()
	rc, _, err := kubebackend.RESTConfig(s.Store.Kubeconfig(s.T, "admin", "default", ""))
	if err != nil {
		s.T.Fatal(err)
	}
	cs, err := clientset.NewForConfig(rc)
	if err != nil {
		s.T.Fatal(err)
	}
	leases := cs.CoordinationV1().Leases("default")
	list, err := leases.List(context.Background(), metav1.ListOptions{LabelSelector: "caddy-leader.io/kind=election"})
	if err != nil {
		s.T.Fatalf("list the election leases: %v", err)
	}
	for _, l := range list.Items {
		if strings.HasPrefix(l.Name, mode+"-default-") {
			return leases, l.Name
		}
	}
	s.T.Fatalf("no election lease of %s among %d", mode, len(list.Items))
	return nil, ""
}

// editElection changes mode's election Lease with edit as `kubectl edit` does: a read,
// and an update conditional on its resourceVersion, read again on a conflict.
func editElection(s *kubeRun, mode string, edit func(*coordv1.Lease)) error {
	s.T.Helper()
	leases, name := electionLease(s, mode)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(l)
		_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
		return err
	})
}
