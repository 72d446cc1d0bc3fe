// Package etcdtest starts real etcd clusters of embedded members on 127.0.0.1 for tests.
package etcdtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
)

const (
	// startAttempts bounds how often Start picks fresh ports: a port found
	// free can be taken by another process before etcd binds it.
	startAttempts = 3

	// readyTimeout bounds the wait for members to join raft and answer a
	// linearizable read. A 3-member cluster normally needs about a second.
	readyTimeout = 20 * time.Second

	// leaderTimeout bounds LeaderIndex's wait; an election after losing the
	// leader takes about one election timeout (1s) plus a little.
	leaderTimeout = 10 * time.Second
)

// Cluster is a set of embedded etcd members that know each other's peer
// URLs. Clients reach a member through a forwarder on its client URL (see
// front), which lets Stop cut their connections at once. Its methods are
// safe for concurrent use.
type Cluster struct {
	members        []*member
	initialCluster string
	opts           Options
	clientTLS      *tls.Config // for the cluster's own clients; nil without Options.TLS
	// authOn is set once Start has enabled authentication; from then on the
	// cluster's own clients log in as root.
	authOn bool

	mu sync.Mutex // guards every member's run field
}

// Options change the cluster that StartWith starts. The zero value is the
// plain cluster of Start: http:// client URLs, no authentication.
type Options struct {
	// TLS, if not nil, makes every member serve clients over TLS only, with
	// TLS's server certificate, at https:// client URLs. Peers still talk
	// plain HTTP to each other.
	TLS *Certs
	// ClientCertAuth makes the members accept only clients that present a
	// certificate signed by TLS's CA and not revoked (Certs.Revoke). It needs
	// TLS.
	ClientCertAuth bool
	// RootPassword, if not empty, turns authentication on once the cluster
	// is ready: a user "root" with this password and the root role is
	// created, then auth is enabled. The cluster's own clients (Client)
	// then log in as root.
	RootPassword string
	// AuthTokenTTL is how long an unused simple auth token stays valid;
	// every request that uses a token restarts its TTL. etcd counts it in
	// whole seconds, so it must be a whole number of seconds, at least 1s.
	// Zero means etcd's default, 5 minutes.
	AuthTokenTTL time.Duration
}

// Start starts a cluster of n members on 127.0.0.1, each with its own free
// client and peer port and a data dir under t.TempDir(). It returns once the
// cluster has a raft leader and every member answers a linearizable read,
// and registers t.Cleanup to stop every member. It fails the test on error.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartWith(t, n, Options{})
}

// StartWith is Start with client TLS or authentication as opts say. With
// RootPassword set, it returns once authentication is on. With -short (the quick tier of
// tests) it skips the test instead: a real store is for the full run.
func StartWith(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("etcdtest: starts an etcd cluster; skipped with -short")
	}
	if n < 1 {
		t.Fatalf("etcdtest: cluster needs at least one member, got %d", n)
	}
	if opts.ClientCertAuth && opts.TLS == nil {
		t.Fatalf("etcdtest: ClientCertAuth needs TLS")
	}
	if opts.AuthTokenTTL < 0 || opts.AuthTokenTTL%time.Second != 0 {
		t.Fatalf("etcdtest: AuthTokenTTL %s is not a whole number of seconds", opts.AuthTokenTTL)
	}
	base := t.TempDir()
	var c *Cluster
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if c, err = tryStart(base, n, opts); err == nil {
			break
		}
		t.Logf("etcdtest: starting %d-member cluster, attempt %d: %v", n, attempt, err)
	}
	if err != nil {
		t.Fatalf("etcdtest: start %d-member cluster: %v", n, err)
	}
	t.Cleanup(c.stopAll)
	if opts.TLS != nil {
		c.clientTLS = opts.TLS.ClientTLS(t)
	}

	if err := c.waitReady(c.runningIndexes()); err != nil {
		t.Fatalf("etcdtest: %d-member cluster did not become ready: %v", n, err)
	}
	if opts.RootPassword != "" {
		if err := c.enableAuth(); err != nil {
			t.Fatalf("etcdtest: enable authentication: %v", err)
		}
		c.authOn = true
	}
	return c
}

// tryStart picks ports and starts every member with a fresh data dir. On
// error nothing is left running.
func tryStart(base string, n int, opts Options) (c *Cluster, err error) {
	// The client ports are bound for good right here, by the fronts; only
	// etcd's own ports can be lost to another process before it binds them.
	fronts := make([]net.Listener, n)
	defer func() {
		if err != nil {
			for _, ln := range fronts {
				if ln != nil {
					ln.Close()
				}
			}
		}
	}()
	for i := range fronts {
		if fronts[i], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
	}
	// etcd binds these again when a stopped member restarts: freeport picks them where
	// no other process is handed ports meanwhile.
	ports, err := freeport.Addrs(2 * n)
	if err != nil {
		return nil, err
	}

	c = &Cluster{opts: opts}
	clientScheme := "http"
	if opts.TLS != nil {
		clientScheme = "https"
	}
	var peers []string
	for i := range n {
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       filepath.Join(base, fmt.Sprintf("m%d", i)),
			clientURL: url.URL{Scheme: clientScheme, Host: fronts[i].Addr().String()},
			listenURL: url.URL{Scheme: clientScheme, Host: ports[2*i]},
			peerURL:   url.URL{Scheme: "http", Host: ports[2*i+1]},
			opts:      opts,
		}
		// A failed attempt may have written a WAL; a new cluster must not
		// find one, or the member would try to rejoin the old cluster.
		if err := os.RemoveAll(m.dir); err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
		peers = append(peers, m.name+"="+m.peerURL.String())
	}
	c.initialCluster = strings.Join(peers, ",")

	// Members start one after another without waiting: StartEtcd does not
	// need a quorum, only readiness does.
	for i, m := range c.members {
		in, err := m.start(c.initialCluster, embed.ClusterStateFlagNew, fronts[i])
		fronts[i] = nil // owned by the instance now, or closed by start
		if err != nil {
			c.stopAll()
			return nil, fmt.Errorf("member %d: %w", i, err)
		}
		c.mu.Lock()
		m.run = in
		c.mu.Unlock()
	}
	return c, nil
}

// Endpoints returns the client URLs of all members, running or not, in
// member order.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL.String()
	}
	return eps
}

// Endpoint returns the client URL of member i.
func (c *Cluster) Endpoint(i int) string {
	return c.members[i].clientURL.String()
}

// Running reports whether member i is running. A member being stopped is
// no longer running.
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].run != nil
}

// Stop stops member i and returns once it is fully closed, keeping its data
// dir and ports for Restart. Stopping a stopped member does nothing.
//
// To clients the member vanishes at once: their connections to it are cut
// before etcd shuts down, and they see the transport fail as in a crash
// (gRPC Unavailable), so they retry on other endpoints. Inside the cluster
// the stop is etcd's graceful one: a stopped leader first hands leadership
// to a peer, so no election timeout passes. It takes about a second.
func (c *Cluster) Stop(t testing.TB, i int) {
	t.Helper()
	c.stop(i)
}

func (c *Cluster) stop(i int) {
	m := c.members[i]
	m.op.Lock()
	defer m.op.Unlock()
	c.mu.Lock()
	in := m.run
	m.run = nil
	c.mu.Unlock()
	if in != nil {
		in.stop()
	}
}

// Restart starts stopped member i again with the same name, data dir and
// ports. If the running members then form a quorum, it waits until every
// running member answers a linearizable read; otherwise it returns at once,
// and the Restart that restores the quorum does the waiting. Restarting a
// running member fails the test, as does a port of the member having been
// taken by another process meanwhile.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	m := c.members[i]
	m.op.Lock()
	defer m.op.Unlock()
	if c.Running(i) {
		t.Fatalf("etcdtest: restart member %d: it is running", i)
	}
	// The data dir holds the WAL, so etcd rejoins as the same member and
	// ignores the initial cluster; "existing" states that intent.
	in, err := m.start(c.initialCluster, embed.ClusterStateFlagExisting, nil)
	if err != nil {
		t.Fatalf("etcdtest: restart member %d: %v", i, err)
	}
	c.mu.Lock()
	m.run = in
	c.mu.Unlock()

	running := c.runningIndexes()
	if len(running) <= len(c.members)/2 {
		t.Logf("etcdtest: restarted member %d without a quorum (%d of %d running); not waiting for it to be ready",
			i, len(running), len(c.members))
		return
	}
	if err := c.waitReady(running); err != nil {
		t.Fatalf("etcdtest: restart member %d: %v", i, err)
	}
}

// LeaderIndex returns the index of the member that is raft leader, waiting
// up to about 10s for every running member to agree on one. It fails the
// test if they do not.
func (c *Cluster) LeaderIndex(t testing.TB) int {
	t.Helper()
	deadline := time.Now().Add(leaderTimeout)
	// Raft's view of the leader is not observable through a channel, so
	// poll at the heartbeat interval.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if i, ok := c.agreedLeader(); ok {
			return i
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcdtest: no agreed raft leader among running members after %v", leaderTimeout)
		}
		<-tick.C
	}
}

// agreedLeader reports the leader if every running member names the same
// one and that one is running and names itself. A member that has just
// restarted and not heard from the leader yet blocks agreement.
func (c *Cluster) agreedLeader() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var lead types.ID
	leader := -1
	for i, m := range c.members {
		if m.run == nil {
			continue
		}
		s := m.run.etcd.Server
		l := s.Leader()
		if l == 0 || (lead != 0 && l != lead) {
			return -1, false
		}
		lead = l
		if s.MemberID() == l {
			leader = i
		}
	}
	return leader, leader >= 0
}

// Client returns a client on the endpoints of the members running now,
// closed at t.Cleanup. It logs nothing. On a TLS cluster it trusts the CA
// and presents the client certificate; with authentication on, it is root.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	eps := c.runningEndpoints(t, "client")
	cli, err := c.newClient(eps)
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// AddUser creates an etcd user with password whose only permission is to
// read and write the keys that start with prefix, through a role of the
// same name. It needs authentication on (Options.RootPassword).
func (c *Cluster) AddUser(t testing.TB, name, password, prefix string) {
	t.Helper()
	if !c.authOn {
		t.Fatalf("etcdtest: AddUser: authentication is not on")
	}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, name); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, name, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, name, password); return err },
		func() error { _, err := cli.UserGrantRole(ctx, name, name); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("etcdtest: add user %q: %v", name, err)
		}
	}
}

// ChangePassword sets the password of an existing user. Tokens issued before
// stay valid until they expire; new logins need the new password.
func (c *Cluster) ChangePassword(t testing.TB, name, password string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := c.Client(t).UserChangePassword(ctx, name, password); err != nil {
		t.Fatalf("etcdtest: change password of %q: %v", name, err)
	}
}

// enableAuth creates root with the root role and turns authentication on.
func (c *Cluster) enableAuth() error {
	cli, err := c.newClient(c.Endpoints())
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if _, err := cli.UserAdd(ctx, "root", c.opts.RootPassword); err != nil {
		return fmt.Errorf("add user root: %w", err)
	}
	// The root role is built in: granting it needs no RoleAdd.
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("grant root the root role: %w", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("auth enable: %w", err)
	}
	return nil
}

// newClient is a client of this cluster: with its client certificate on a
// TLS cluster, and logged in as root once authentication is on.
func (c *Cluster) newClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(c.clientConfig(endpoints))
}

// clientConfig is the config of the cluster's own clients on endpoints.
func (c *Cluster) clientConfig(endpoints []string) clientv3.Config {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		TLS:         c.clientTLS,
		Logger:      zap.NewNop(),
	}
	if c.authOn {
		cfg.Username, cfg.Password = "root", c.opts.RootPassword
	}
	return cfg
}

// newClient is a plain client, for a cluster started without Options.
func newClient(endpoints []string) (*clientv3.Client, error) {
	return (&Cluster{}).newClient(endpoints)
}

// runningEndpoints are the client URLs of the running members; there must be one, for what.
func (c *Cluster) runningEndpoints(t testing.TB, what string) []string {
	t.Helper()
	var eps []string
	for _, i := range c.runningIndexes() {
		eps = append(eps, c.Endpoint(i))
	}
	if len(eps) == 0 {
		t.Fatalf("etcdtest: %s: no member is running", what)
	}
	return eps
}

func (c *Cluster) runningIndexes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var idx []int
	for i, m := range c.members {
		if m.run != nil {
			idx = append(idx, i)
		}
	}
	return idx
}

// waitReady waits until each listed member has published itself to the
// cluster and then answers a linearizable read through its own endpoint,
// which proves a leader exists and the member has caught up with it.
func (c *Cluster) waitReady(idx []int) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, i := range idx {
		c.mu.Lock()
		in := c.members[i].run
		c.mu.Unlock()
		if in == nil {
			return fmt.Errorf("member %d stopped while waiting for it", i)
		}
		select {
		case <-in.etcd.Server.ReadyNotify():
		case err := <-in.etcd.Err():
			return fmt.Errorf("member %d: %w", i, err)
		case <-in.etcd.Server.StopNotify():
			return fmt.Errorf("member %d stopped while waiting for it", i)
		case <-ctx.Done():
			return fmt.Errorf("member %d: not ready after %v", i, readyTimeout)
		}
		if err := c.linearizableRead(ctx, c.Endpoint(i)); err != nil {
			return fmt.Errorf("member %d: %w", i, err)
		}
	}
	return nil
}

func (c *Cluster) linearizableRead(ctx context.Context, endpoint string) error {
	cli, err := c.newClient([]string{endpoint})
	if err != nil {
		return err
	}
	defer cli.Close()
	retry := time.NewTicker(50 * time.Millisecond)
	defer retry.Stop()
	for {
		// A short timeout per try: a read sent before the member has
		// caught up can hang rather than fail.
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(tctx, "etcdtest/ready")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no linearizable read from %s: %w", endpoint, errors.Join(err, ctx.Err()))
		case <-retry.C:
		}
	}
}

// stopAll stops every member and closes their fronts, for good.
func (c *Cluster) stopAll() {
	c.stopMembers()
	for _, m := range c.members {
		if m.front != nil {
			m.front.close()
		}
	}
}

// stopMembers stops non-leaders first: a leader stopped last finds no peer
// to hand leadership to and closes at once, instead of waiting out a
// transfer to a peer that is itself going away.
func (c *Cluster) stopMembers() {
	c.mu.Lock()
	var order []int
	lead := -1
	for i, m := range c.members {
		switch {
		case m.run == nil:
		case m.run.etcd.Server.MemberID() == m.run.etcd.Server.Leader():
			lead = i
		default:
			order = append(order, i)
		}
	}
	c.mu.Unlock()
	if lead >= 0 {
		order = append(order, lead)
	}
	for _, i := range order {
		c.stop(i)
	}
}
