// Package etcdbackend is the elector's Backend on etcd: leases, the compare-and-swap campaign
// transaction, deletes guarded by the fencing token, and watches.
package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddyleader/caddy-leader/elector"
)

// Config says how to reach etcd and where the election keys live.
type Config struct {
	// Endpoints are etcd client URLs (http://host:port, https://host:port) or host:port.
	Endpoints []string
	// Prefix is prepended to every election name to form its key.
	Prefix string
	// DialTimeout bounds establishing a connection to an endpoint.
	DialTimeout time.Duration
	// Logger receives the etcd client's own errors; nil discards them.
	Logger *zap.Logger
}

// Backend talks to one etcd cluster. It connects lazily, on its first request, so that
// creating one (as Caddy does when it validates a config) costs nothing and an unreachable
// cluster never blocks a start: requests fail and the elector retries.
type Backend struct {
	cfg Config

	mu     sync.Mutex
	cli    *clientv3.Client
	closed bool
}

var _ elector.Backend = (*Backend)(nil)

// ErrClosed is returned by requests on a closed Backend.
var ErrClosed = errors.New("etcdbackend: closed")

// New checks cfg and returns a Backend that has not connected yet.
func New(cfg Config) (*Backend, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcdbackend: no endpoints")
	}
	for _, ep := range cfg.Endpoints {
		if err := CheckEndpoint(ep); err != nil {
			return nil, err
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Backend{cfg: cfg}, nil
}

// CheckEndpoint reports whether ep is an etcd client URL with an http or https scheme and a
// port, or a bare host:port.
func CheckEndpoint(ep string) error {
	hostport := ep
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return fmt.Errorf("endpoint %q is not a URL: %v", ep, err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("endpoint %q: scheme must be http or https", ep)
		}
		if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
			return fmt.Errorf("endpoint %q: only scheme://host:port is allowed", ep)
		}
		hostport = u.Host
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("endpoint %q is neither a URL nor host:port: %v", ep, err)
	}
	if host == "" || port == "" {
		return fmt.Errorf("endpoint %q needs both a host and a port", ep)
	}
	return nil
}

// Key is the etcd key of an election.
func (b *Backend) Key(election string) string { return b.cfg.Prefix + election }

func (b *Backend) client() (*clientv3.Client, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	if b.cli != nil {
		return b.cli, nil
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   b.cfg.Endpoints,
		DialTimeout: b.cfg.DialTimeout,
		// gRPC keepalives notice a silently dead connection so the client moves to another
		// member; etcd refuses pings more often than every 5s by default.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		PermitWithoutStream:  true,
		// The client logs every retried request at WARN; the elector already reports
		// etcd trouble once per outage, so only the client's errors are worth passing on.
		Logger: b.cfg.Logger.WithOptions(zap.IncreaseLevel(zapcore.ErrorLevel)),
	})
	if err != nil {
		return nil, err
	}
	b.cli = cli
	return cli, nil
}

// leaderCtx makes requests fail fast on a member cut off from the raft leader, instead of
// hanging there while the rest of the cluster carries on.
func leaderCtx(ctx context.Context) context.Context { return clientv3.WithRequireLeader(ctx) }

// Grant implements elector.Backend. etcd leases have whole-second TTLs, so ttl is rounded up.
func (b *Backend) Grant(ctx context.Context, ttl time.Duration) (elector.LeaseID, time.Duration, error) {
	cli, err := b.client()
	if err != nil {
		return 0, 0, err
	}
	resp, err := cli.Grant(leaderCtx(ctx), int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return 0, 0, err
	}
	return elector.LeaseID(resp.ID), time.Duration(resp.TTL) * time.Second, nil
}

// Renew implements elector.Backend.
func (b *Backend) Renew(ctx context.Context, id elector.LeaseID) (time.Duration, error) {
	cli, err := b.client()
	if err != nil {
		return 0, err
	}
	resp, err := cli.KeepAliveOnce(leaderCtx(ctx), clientv3.LeaseID(id))
	if err != nil {
		return 0, mapLeaseErr(err)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Revoke implements elector.Backend. Revoking a lease that is already gone is not an error.
func (b *Backend) Revoke(ctx context.Context, id elector.LeaseID) error {
	cli, err := b.client()
	if err != nil {
		return err
	}
	_, err = cli.Revoke(leaderCtx(ctx), clientv3.LeaseID(id))
	if errors.Is(mapLeaseErr(err), elector.ErrLeaseNotFound) {
		return nil
	}
	return err
}

func mapLeaseErr(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
		return elector.ErrLeaseNotFound
	}
	return err
}

// Campaign implements elector.Backend with one transaction:
// if CreateRevision(key) == 0 then Put(key, value, lease) else Get(key).
func (b *Backend) Campaign(ctx context.Context, election string, value []byte, lease elector.LeaseID) (elector.Observation, error) {
	cli, err := b.client()
	if err != nil {
		return elector.Observation{}, err
	}
	key := b.Key(election)
	resp, err := cli.Txn(leaderCtx(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value), clientv3.WithLease(clientv3.LeaseID(lease)))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return elector.Observation{}, mapLeaseErr(err)
	}
	rev := resp.Header.Revision
	if resp.Succeeded {
		// The put is the transaction's only write, so the key was created at its revision.
		return elector.Observation{Revision: rev, Holder: &elector.Holder{Value: value, Lease: lease, Token: rev}}, nil
	}
	return observation(rev, resp.Responses[0].GetResponseRange().GetKvs()), nil
}

// Observe implements elector.Backend.
func (b *Backend) Observe(ctx context.Context, election string) (elector.Observation, error) {
	cli, err := b.client()
	if err != nil {
		return elector.Observation{}, err
	}
	resp, err := cli.Get(leaderCtx(ctx), b.Key(election))
	if err != nil {
		return elector.Observation{}, err
	}
	return observation(resp.Header.Revision, resp.Kvs), nil
}

func observation(rev int64, kvs []*mvccpb.KeyValue) elector.Observation {
	if len(kvs) == 0 {
		return elector.Observation{Revision: rev}
	}
	return elector.Observation{Revision: rev, Holder: holder(kvs[0])}
}

func holder(kv *mvccpb.KeyValue) *elector.Holder {
	return &elector.Holder{Value: kv.Value, Lease: elector.LeaseID(kv.Lease), Token: kv.CreateRevision}
}

// Watch implements elector.Backend.
func (b *Backend) Watch(ctx context.Context, election string, afterRev int64) <-chan elector.Observation {
	out := make(chan elector.Observation, 1)
	go func() {
		defer close(out)
		send := func(o elector.Observation) bool {
			select {
			case out <- o:
				return true
			case <-ctx.Done():
				return false
			}
		}
		cli, err := b.client()
		if err != nil {
			send(elector.Observation{Err: err})
			return
		}
		for resp := range cli.Watch(leaderCtx(ctx), b.Key(election), clientv3.WithRev(afterRev+1)) {
			if err := resp.Err(); err != nil {
				send(elector.Observation{Err: err})
				return
			}
			for _, ev := range resp.Events {
				o := elector.Observation{Revision: ev.Kv.ModRevision}
				if ev.Type == clientv3.EventTypePut {
					o.Holder = holder(ev.Kv)
				}
				if !send(o) {
					return
				}
			}
		}
		if ctx.Err() == nil {
			send(elector.Observation{Err: errors.New("etcd watch closed")})
		}
	}()
	return out
}

// Release implements elector.Backend: delete the key only if it is still the same term's.
func (b *Backend) Release(ctx context.Context, election string, token int64) error {
	cli, err := b.client()
	if err != nil {
		return err
	}
	key := b.Key(election)
	_, err = cli.Txn(leaderCtx(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).
		Then(clientv3.OpDelete(key)).
		Commit()
	return err
}

// Close implements elector.Backend.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.cli == nil {
		return nil
	}
	return b.cli.Close()
}
