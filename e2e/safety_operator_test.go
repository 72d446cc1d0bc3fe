//go:build unix

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/safety"
)

// electionKey is the election key of the fleet's leader app (default prefix and election).
const electionKey = "/caddy-leader/default"

// TestSafetyOperator: what an operator does by hand to the election in etcd, while the
// leader hears of it late, must not let two instances admit at once, in any follower mode:
//
//	go test -count=1 -v -run TestSafetyOperator ./e2e/
//
// key_deleted is `etcdctl del` of the election key and lease_revoked `etcdctl lease revoke`
// of the leader's lease, while the leader's links to etcd are slow. key_deleted_while_cut_off
// deletes the key half a ttl after the leader was cut off from etcd: its lease then has
// less than a second left, which etcd reports as a TTL of 0, while the leader still admits
// until its own deadline. The clients' load goes round-robin to every instance, so the
// leader is sent requests directly and, in forward mode, through its followers too. Each
// scenario's report gives the double admissions it saw (count and longest overlap).
func TestSafetyOperator(t *testing.T) {
	needCaddy(t)
	results := startResults(t, fmt.Sprintf("ttl %v", ttl))

	allModes := []string{"reject", "redirect", "forward"}
	ops := []struct {
		name  string
		cut   bool     // cut the leader's links, rather than slow them
		modes []string // follower modes to run it in
		act   func(s *scenarioRun, cli *clientv3.Client) error
	}{
		{"key_deleted", false, allModes, deleteElectionKey},
		{"lease_revoked", false, allModes, revokeLeaderLease},
		// One mode: the hole is in the successor's wait, whatever the followers do.
		{"key_deleted_while_cut_off", true, []string{"forward"}, deleteElectionKey},
	}
	// Every scenario starts a world of its own: they run side by side (see TestSafety).
	for _, op := range ops {
		report := make([]func(safetyReport), len(op.modes))
		for i := range op.modes {
			report[i] = results.row()
		}
		t.Run(op.name, func(t *testing.T) {
			t.Parallel()
			for i, mode := range op.modes {
				t.Run(mode, func(t *testing.T) {
					t.Parallel()
					rep := runScenario(t, safetyScenario{
						Name:   fmt.Sprintf("operator_%s_%s", op.name, mode),
						Load:   9 * time.Second,
						Change: safety.MustChange,
						Config: func(c *Config) { c.Follower = mode },
						Fault:  operatorFault(op.cut, op.act),
					})
					t.Logf("%s: %d double admissions (by time), overlap up to %s; %d stale arrivals (by token), %d with a wrong token",
						rep.Scenario, rep.Double, safety.FmtDur(rep.DoubleSpan), rep.Stale, rep.Wrong)
					report[i](rep)
				})
			}
		})
	}
}

// operatorFault is safety.OperatorFault with act given the operator's etcd client.
func operatorFault(cut bool, act func(s *scenarioRun, cli *clientv3.Client) error) func(s *scenarioRun) {
	return safety.OperatorFault(cut, func(s *scenarioRun) error { return act(s, s.Store.Client()) })
}

// deleteElectionKey is `etcdctl del` of the election key, by the operator in s.
func deleteElectionKey(s *scenarioRun, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Delete(ctx, electionKey)
	if err != nil || resp.Deleted != 1 {
		return fmt.Errorf("delete the election key: %v (deleted %v)", err, resp)
	}
	return nil
}

// revokeLeaderLease is `etcdctl lease revoke` of the leader's lease, by the operator in s.
func revokeLeaderLease(s *scenarioRun, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := revokeElectionLease(ctx, cli)
	if err != nil {
		return err
	}
	if kv.CreateRevision != s.Token {
		return fmt.Errorf("revoked the lease of term %d, not the leader's %d", kv.CreateRevision, s.Token)
	}
	s.Notes = append(s.Notes, fmt.Sprintf("revoked lease %x", kv.Lease))
	return nil
}

// revokeElectionLease revokes the lease the election key is bound to, and returns the key
// as it was.
func revokeElectionLease(ctx context.Context, cli *clientv3.Client) (*mvccpb.KeyValue, error) {
	resp, err := cli.Get(ctx, electionKey)
	if err != nil {
		return nil, fmt.Errorf("read the election key: %v", err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		return nil, fmt.Errorf("no election key bound to a lease: %v", resp.Kvs)
	}
	kv := resp.Kvs[0]
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
		return nil, fmt.Errorf("revoke lease %x of term %d: %v", kv.Lease, kv.CreateRevision, err)
	}
	return kv, nil
}
