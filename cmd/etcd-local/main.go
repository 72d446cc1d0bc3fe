// Command etcd-local runs a single-member etcd on loopback, embedded from etcd's own server
// packages, so that caddy-leader can be tried without an etcd cluster. Not for production.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	client := flag.String("listen", "127.0.0.1:2379", "client address (host:port)")
	peer := flag.String("peer", "127.0.0.1:2380", "peer address (host:port)")
	dir := flag.String("data-dir", "", "data directory (default: a temporary one, removed on exit)")
	flag.Parse()
	if err := run(*client, *peer, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-local:", err)
		os.Exit(1)
	}
}

func run(client, peer, dir string) error {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "etcd-local-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	cfg := embed.NewConfig()
	cfg.Name = "local"
	cfg.Dir = dir
	// etcd reports its own listeners closing at shutdown as errors; real failures
	// surface through StartEtcd and e.Err().
	cfg.LogLevel = "fatal"
	clientURL, peerURL := url.URL{Scheme: "http", Host: client}, url.URL{Scheme: "http", Host: peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start (is %s or %s in use?): %w", client, peer, err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		return fmt.Errorf("not ready after 30s")
	}
	fmt.Printf("etcd-local: serving %s (data in %s); Ctrl-C stops it\n", clientURL.String(), dir)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	select {
	case <-stop:
		return nil
	case err := <-e.Err():
		return err
	}
}
