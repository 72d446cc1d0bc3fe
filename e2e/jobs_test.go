//go:build unix

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/jobrec"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestJobsUnderFaults is jobrec.Faults on etcd and PostgreSQL: a job every second on three
// Caddy processes, a fault while the leader's run is under way, and the service's record of
// every run checked (docs/jobs.md says what a job promises).
func TestJobsUnderFaults(t *testing.T) {
	needCaddy(t)
	t.Run("etcd", func(t *testing.T) { jobrec.Faults(t, caddyBin, etcdJobStore) })
	t.Run("postgres", func(t *testing.T) { jobrec.Faults(t, caddyBin, pgJobStore(pgtest.Start(t))) })
}

// etcdJobStore is a one-member etcd, new for each fleet.
func etcdJobStore(t *testing.T) *jobrec.Store {
	etcd := etcdtest.Start(t, 1)
	s := &jobrec.Store{Proxies: jobrec.Proxies(t, strings.TrimPrefix(etcd.Endpoint(0), "http://"))}
	s.Config = Config{Endpoints: etcd.Endpoints(), InstanceEndpoints: map[string][]string{}}
	for id, p := range s.Proxies {
		s.Config.InstanceEndpoints[id] = []string{p.URL()}
	}
	s.DeleteKey = func(t *testing.T) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if resp, err := cli.Delete(ctx, electionKey); err != nil || resp.Deleted != 1 {
			t.Fatalf("deleting %s: %+v, %v", electionKey, resp, err)
		}
	}
	s.Stop = func(t *testing.T) { etcd.Stop(t, 0) }
	s.Start = func(t *testing.T) { etcd.Restart(t, 0) }
	return s
}

// pgJobStore is server, with tables of their own for each fleet.
func pgJobStore(server *pgtest.Server) func(t *testing.T) *jobrec.Store {
	fleets := 0
	return func(t *testing.T) *jobrec.Store {
		fleets++
		name := fmt.Sprintf("jobs%d", fleets)
		s := &jobrec.Store{Proxies: jobrec.Proxies(t, server.Addr())}
		s.Config = Config{InstanceStore: map[string]map[string]any{}}
		for id, p := range s.Proxies {
			s.Config.InstanceStore[id] = pgStoreConfig(server, p.Addr(), name, id, nil)
		}
		s.Config.Store = s.Config.InstanceStore["c0"]
		s.DeleteKey = func(t *testing.T) {
			server.Exec(t, fmt.Sprintf(`DELETE FROM %selections WHERE name = 'default'`, pgTablePrefix(name)))
		}
		s.Stop = func(t *testing.T) { server.Stop(t) }
		s.Start = func(t *testing.T) { server.Start(t) }
		return s
	}
}
