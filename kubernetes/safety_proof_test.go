package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
	"github.com/caddyleader/caddy-leader/kubernetes/internal/kubetest"
)

// TestSafetyUnseenTerm: a campaign on Kubernetes must name the term it follows, so that an
// instance never takes its own earlier term for the last one when terms it did not see
// came after it (issue 25, case 4):
//
//	cd kubernetes && go test -count=1 -v -run TestSafetyUnseenTerm .
//
// A leads and is cut off from the API server; its term ends and B wins. B is cut off too,
// and an operator deletes the election Lease; then A's link comes back. A must not admit
// before B's deadline has passed, in every follower mode.
func TestSafetyUnseenTerm(t *testing.T) {
	needCaddy(t)
	started := time.Now()
	srv := kubetest.Start(t, kubetest.Options{})
	var reports []safety.Report
	defer func() {
		t.Logf("RESULTS (ttl %v, 2 instances, kube-apiserver, %d req/s; %v in all):%s", safetyTTL, safetyRate, time.Since(started).Round(time.Second), safety.Table(reports))
	}()
	for _, mode := range []string{"reject", "forward"} {
		t.Run(mode, func(t *testing.T) {
			prefix := "unseen-" + mode
			env := startKubeEnvN(t, srv, mode, prefix, 2)
			sc := kubeScenario{Name: "unseen_" + mode + "_terms_after_the_own_one", Load: 5*safetyTTL + 4*time.Second,
				Warmup: safetyWarmup, Rate: safetyRate, Change: safety.MustChange,
				Fault: func(s *kubeRun) {
					a := s.Leader
					b := fleet.Others(s.Fleet, a)[0]
					s.Cut(a)
					s.T.Cleanup(func() { s.Heal(a) })
					next, token := fleet.WaitStableLeader(s.T, []*fleet.Instance{b}, safety.RecoverTimeout)
					if next != b {
						s.T.Fatalf("%s leads after %s was cut off, want %s", next, a, b)
					}
					time.Sleep(safetyTTL / 2) // b admits
					s.Cut(b)
					s.T.Cleanup(func() { s.Heal(b) })
					leases, name := electionLease(s, prefix)
					if err := leases.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
						s.T.Fatalf("delete the election Lease: %v", err)
					}
					s.Heal(a)
					s.Notes = append(s.Notes, fmt.Sprintf("%s:%d cut off, its Lease deleted, %s's link back", b, token, a))
					time.Sleep(2 * safetyTTL)
					s.Heal(b)
				},
				Check: func(t *testing.T, s *kubeRun, rep *safety.Report) {
					safety.NoteDouble(rep)
				}}
			reports = append(reports, safety.RunOn(t, env, sc))
		})
	}
}

// startKubeEnvN starts a fleet of n in follower mode on srv, each instance through a fault
// proxy of its own and under lease prefix prefix, with change applied to the fleet's config,
// and waits for a leader.
func startKubeEnvN(t *testing.T, srv *kubetest.Server, mode, prefix string, n int, change ...func(*fleet.Config)) *kubeEnv {
	t.Helper()
	env := safety.NewEnv(t, caddyBin, srv, fleet.Config{Follower: mode, TTL: safetyTTL.String()})
	for _, c := range change {
		c(&env.Cfg)
	}
	env.LinkEach(n, strings.TrimPrefix(srv.URL, "https://"), func(id, addr string) map[string]any {
		return map[string]any{"module": "kubernetes", "kubeconfig": srv.Kubeconfig(t, "admin", "default", "https://"+addr), "lease_prefix": prefix + "-"}
	})
	env.Launch(t, n)
	return env
}
