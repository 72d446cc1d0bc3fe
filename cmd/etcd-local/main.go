// Command etcd-local runs an etcd member on loopback, embedded from etcd's own server packages,
// so that caddy-leader can be tried without an etcd cluster. Not for production.
//
// Without flags it runs a single-member cluster on 127.0.0.1:2379. With -name and
// -initial-cluster it runs one member of a multi-member cluster (the end-to-end tests start
// three of them as processes, to kill and freeze them):
//
//	etcd-local -name m0 -listen 127.0.0.1:23790 -peer 127.0.0.1:23800 -data-dir data/m0 \
//		-initial-cluster m0=http://127.0.0.1:23800,m1=http://127.0.0.1:23801,m2=http://127.0.0.1:23802
//
// A member restarted with the same -data-dir rejoins as itself; the -initial-cluster flags are
// then ignored. Without -data-dir the data lives in a temporary directory that is deleted
// when the command stops: every election, fencing token and history starts over, and
// instances still running see the store go back in time (they log it at ERROR and campaign
// anew). Give -data-dir to keep it.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// options are the command's flags.
type options struct {
	client, peer, dir string
	name              string
	initialCluster    string
	clusterState      string
	clusterToken      string
	logLevel          string
}

func main() {
	var o options
	flag.StringVar(&o.client, "listen", "127.0.0.1:2379", "client address (host:port)")
	flag.StringVar(&o.peer, "peer", "127.0.0.1:2380", "peer address (host:port)")
	flag.StringVar(&o.dir, "data-dir", "", "data directory, kept across restarts (default: a temporary one, deleted on exit)")
	flag.StringVar(&o.name, "name", "local", "member name")
	flag.StringVar(&o.initialCluster, "initial-cluster", "", "name=http://peer,... of every member (default: this member alone)")
	flag.StringVar(&o.clusterState, "initial-cluster-state", "new", "new, or existing to join a running cluster")
	flag.StringVar(&o.clusterToken, "initial-cluster-token", "etcd-local", "token that tells this cluster's members from another's")
	flag.StringVar(&o.logLevel, "log-level", "fatal", "etcd's log level: debug, info, warn, error, panic or fatal")
	flag.Parse()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	if err := run(o, stop, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-local:", err)
		os.Exit(1)
	}
}

// run serves until stop delivers, and says where it serves and what becomes of its data on out.
func run(o options, stop <-chan os.Signal, out io.Writer) error {
	dir, kept := o.dir, "kept across restarts"
	if dir == "" {
		kept = "DELETED when it stops: every election, token and history starts over (keep them with -data-dir <dir>)"
		tmp, err := os.MkdirTemp("", "etcd-local-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	cfg := embed.NewConfig()
	cfg.Name = o.name
	cfg.Dir = dir
	// etcd reports its own listeners closing at shutdown as errors; real failures
	// surface through StartEtcd and e.Err().
	cfg.LogLevel = o.logLevel
	clientURL, peerURL := url.URL{Scheme: "http", Host: o.client}, url.URL{Scheme: "http", Host: o.peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = o.initialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	}
	cfg.ClusterState = o.clusterState
	cfg.InitialClusterToken = o.clusterToken

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start (is %s or %s in use?): %w", o.client, o.peer, err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("not ready after 30s (a member of a cluster is ready once a quorum of members runs)")
	}
	fmt.Fprintf(out, "etcd-local: serving %s (member %s); Ctrl-C stops it\netcd-local: data in %s, %s\n", clientURL.String(), o.name, dir, kept)

	select {
	case <-stop:
		return nil
	case err := <-e.Err():
		return err
	}
}
