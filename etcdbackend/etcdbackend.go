// Package etcdbackend is the elector's Backend on etcd: leases, the compare-and-swap campaign
// transaction, deletes guarded by the fencing token, and watches.
package etcdbackend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
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

	// TLS, if not nil, makes the client connect with TLS to https:// and host:port
	// endpoints (see LoadTLS); http:// endpoints are then refused. If nil, https://
	// endpoints use TLS with the system's root CAs and no client certificate.
	TLS *tls.Config
	// Username and Password log in to etcd (both or neither). The client fetches a token
	// when it connects and fetches a new one whenever etcd rejects the old one.
	Username string
	Password string
}

// Backend talks to one etcd cluster. It connects lazily, on its first request, so that
// creating one (as Caddy does when it validates a config) costs nothing and an unreachable
// cluster never blocks a start: requests fail and the elector retries.
//
// Connecting with a username includes logging in, which can fail (wrong password, TLS
// refused) or wait for an unreachable cluster. A failed connect is not kept: the next
// request connects again. A request never waits for a connect longer than its context
// allows; the connect goes on, and a later request gets its client.
type Backend struct {
	cfg Config
	tls *tls.Config // what the client uses: cfg.TLS, or the system roots for https://

	// ctx ends a connect in progress when the backend is closed.
	ctx    context.Context
	cancel context.CancelFunc

	mu         sync.Mutex
	cli        *clientv3.Client
	connecting *connectAttempt // nil when no connect is in progress
	lastErr    error           // why the last connect failed, until one succeeds
	loggedErr  string          // the connect failure last logged here, until one succeeds
	closed     bool
	connects   sync.WaitGroup

	tlsFailure tlsFailureLog

	// granted remembers the TTL of each lease granted here (elector.LeaseID ->
	// time.Duration), so that an acknowledgement can live as long as its holder's lease.
	granted sync.Map
	acks    ackLeases // the leases acknowledgements are put under
	revs    revisions // the store's history as this backend has seen it (see rewind.go)

	// groups are the groups of elections whose heartbeats share a beacon (beacon.go),
	// and written what this backend last wrote to each election's key.
	groups  beacon.Groups[group]
	written beacon.Written
}

// connectAttempt is one run of clientv3.New; its result is set before done is closed.
type connectAttempt struct {
	done    chan struct{}
	cli     *clientv3.Client
	err     error
	waiting int // requests still waiting for the result; guarded by Backend.mu
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
	if err := CheckSchemes(cfg.Endpoints); err != nil {
		return nil, fmt.Errorf("etcdbackend: %w", err)
	}
	if err := CheckSecurity(cfg.Endpoints, cfg.TLS != nil, cfg.Username, cfg.Password); err != nil {
		return nil, fmt.Errorf("etcdbackend: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	b := &Backend{cfg: cfg, tls: effectiveTLS(cfg), revs: newRevisions()}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b, nil
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

// client returns the connected client, connecting first if there is none. It waits for a
// connect at most until ctx ends.
func (b *Backend) client(ctx context.Context) (*clientv3.Client, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, ErrClosed
	}
	if b.cli != nil {
		cli := b.cli
		b.mu.Unlock()
		return cli, nil
	}
	a := b.connecting
	if a == nil {
		a = &connectAttempt{done: make(chan struct{})}
		b.connecting = a
		b.connects.Add(1)
		go b.connect(a)
	}
	a.waiting++
	last := b.lastErr
	b.mu.Unlock()

	select {
	case <-a.done:
		return a.cli, a.err
	case <-ctx.Done():
		b.mu.Lock()
		a.waiting--
		b.mu.Unlock()
		if last != nil {
			return nil, fmt.Errorf("still connecting to etcd after the last attempt failed: %w", last)
		}
		// A login waits for a connection that a failed TLS handshake never gives it.
		return nil, b.describe(fmt.Errorf("connecting to etcd: %w", ctx.Err()))
	}
}

// connect runs one clientv3.New, which logs in when a username is set, and keeps the
// client if it succeeds.
//
// A failure that every waiting request gave up on before it came (a slow login, a TLS
// handshake that never completes) would reach the log only as their "deadline exceeded",
// so it is logged here, once until a connect succeeds or the reason changes.
func (b *Backend) connect(a *connectAttempt) {
	defer b.connects.Done()
	cli, err := b.newClient()
	err = b.describe(err)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.connecting = nil
	if err == nil && b.closed {
		cli.Close()
		cli, err = nil, ErrClosed
	}
	switch {
	case err == nil:
		b.cli, b.lastErr, b.loggedErr = cli, nil, ""
	case b.closed:
		b.lastErr = err
	default:
		b.lastErr = err
		if a.waiting == 0 && err.Error() != b.loggedErr {
			b.loggedErr = err.Error()
			b.cfg.Logger.Warn("could not connect to etcd; requests fail until a connect succeeds", zap.Error(err))
		}
	}
	a.cli, a.err = cli, err
	close(a.done)
}

// reconnect paces gRPC's attempts to reach a member that is down. gRPC's default backoff
// grows to two minutes: after an outage of the whole cluster of 20 s, the next attempt
// could come about 10 s after etcd was back, while etcd, restarted, extends every lease by
// its ttl only. A leader riding the outage on failsafe then lost its lease for want of a
// connection (the e2e failsafe scenario F1 saw it 4.5 s after the restart), and every
// instance stayed cut off seconds longer than the store. Attempts every half second at
// most keep a reconnection well inside the shortest ttl; refused connections to a member
// that is down cost it nothing.
var reconnect = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  100 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   500 * time.Millisecond,
	},
	MinConnectTimeout: 5 * time.Second,
}

func (b *Backend) newClient() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   b.cfg.Endpoints,
		DialTimeout: b.cfg.DialTimeout,
		TLS:         b.tls,
		Username:    b.cfg.Username,
		Password:    b.cfg.Password,
		// Close ends a login that waits for an unreachable cluster.
		Context:     b.ctx,
		DialOptions: append(b.dialOptions(), grpc.WithConnectParams(reconnect)),
		// gRPC keepalives notice a silently dead connection so the client moves to another
		// member; etcd refuses pings more often than every 5s by default.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		PermitWithoutStream:  true,
		// The client logs every retried request at WARN; the elector already reports
		// etcd trouble once per outage, so only the client's errors are worth passing on.
		Logger: b.cfg.Logger.WithOptions(zap.IncreaseLevel(zapcore.ErrorLevel)),
	})
}

// leaderCtx makes requests fail fast on a member cut off from the raft leader, instead of
// hanging there while the rest of the cluster carries on.
func leaderCtx(ctx context.Context) context.Context { return clientv3.WithRequireLeader(ctx) }

// Grant implements elector.Backend. etcd leases have whole-second TTLs, so ttl is rounded up.
func (b *Backend) Grant(ctx context.Context, ttl time.Duration) (elector.LeaseID, time.Duration, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return 0, 0, err
	}
	at := b.mark()
	resp, err := cli.Grant(leaderCtx(ctx), int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return 0, 0, b.describe(err)
	}
	// A lease granted by a rewound store is dropped (it expires by itself): the elector
	// asks again, and that lease belongs to the history later answers are checked against.
	if err := b.checked(at, resp.ResponseHeader); err != nil {
		return 0, 0, err
	}
	b.leaseFresh()
	granted := time.Duration(resp.TTL) * time.Second
	b.granted.Store(elector.LeaseID(resp.ID), granted)
	return elector.LeaseID(resp.ID), granted, nil
}

// Renew implements elector.Backend.
func (b *Backend) Renew(ctx context.Context, id elector.LeaseID) (time.Duration, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return 0, err
	}
	at := b.mark()
	if b.takeRenewOwed() {
		return 0, fmt.Errorf("lease %x was granted before: %w", id, errRewoundElsewhere)
	}
	resp, err := cli.KeepAliveOnce(leaderCtx(ctx), clientv3.LeaseID(id))
	if err != nil {
		return 0, b.describe(mapLeaseErr(err))
	}
	// The lease of a snapshot lives on in the restored store, so its renewal succeeds:
	// only the header tells. Renewals run every TTL/3, so they usually notice first.
	if err := b.loose(ctx, cli, at, resp.ResponseHeader); err != nil {
		b.takeRenewOwed() // reported right here
		return 0, err
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Revoke implements elector.Backend. Revoking a lease that is already gone is not an error.
func (b *Backend) Revoke(ctx context.Context, id elector.LeaseID) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	at := b.mark()
	resp, err := cli.Revoke(leaderCtx(ctx), clientv3.LeaseID(id))
	if err == nil || errors.Is(mapLeaseErr(err), elector.ErrLeaseNotFound) {
		b.granted.Delete(id)
	}
	if errors.Is(mapLeaseErr(err), elector.ErrLeaseNotFound) {
		return nil
	}
	if err != nil {
		return b.describe(err)
	}
	return b.checked(at, resp.Header)
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
	cli, err := b.client(ctx)
	if err != nil {
		return elector.Observation{}, err
	}
	cmp, then, els := b.campaignTxn(election, value, lease)
	resp, at, err := b.commit(ctx, cli, cmp, then, els)
	if err != nil {
		return elector.Observation{}, err
	}
	return b.campaigned(at, election, value, lease, resp.Header.Revision, resp.Succeeded, resp.Responses)
}

// commit sends the transaction If(cmp) Then(then) Else(els) and checks its answer's
// revision, as every request's (see checked); at is when it was sent.
func (b *Backend) commit(ctx context.Context, cli *clientv3.Client, cmp []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, mark, error) {
	at := b.mark()
	resp, err := cli.Txn(leaderCtx(ctx)).If(cmp...).Then(then...).Else(els...).Commit()
	if err != nil {
		return nil, at, b.describe(mapLeaseErr(err))
	}
	if err := b.checked(at, resp.Header); err != nil {
		return nil, at, err
	}
	return resp, at, nil
}

// campaignTxn is the transaction of a campaign for election: create the key if it does not
// exist, and with it rewrite the last-term key and consume the acknowledgements; else read
// the key.
func (b *Backend) campaignTxn(election string, value []byte, lease elector.LeaseID) (cmp []clientv3.Cmp, then, els []clientv3.Op) {
	key, last := b.Key(election), b.lastTermKey(election)
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		[]clientv3.Op{clientv3.OpGet(last), clientv3.OpPut(key, string(value), clientv3.WithLease(clientv3.LeaseID(lease))), clientv3.OpPut(last, ""),
			clientv3.OpGet(b.releasedPrefix(election), clientv3.WithPrefix()),
			clientv3.OpDelete(b.releasedPrefix(election), clientv3.WithPrefix())},
		[]clientv3.Op{clientv3.OpGet(key)}
}

// campaigned turns the answer to campaignTxn, sent at at and answered at revision rev, into
// the campaign's observation.
func (b *Backend) campaigned(at mark, election string, value []byte, lease elector.LeaseID, rev int64, won bool, responses []*pb.ResponseOp) (elector.Observation, error) {
	if !won {
		return b.termChecked(at, election, observation(rev, responses[0].GetResponseRange().GetKvs()))
	}
	// Every write of a transaction has its revision, so the key was created at it. The
	// last-term key was written by every term's campaign, so before this one its mod
	// revision was the previous term's token.
	o := elector.Observation{Revision: rev, Holder: &elector.Holder{Value: value, Lease: lease, Token: rev}}
	b.written.Won(election, rev, lease, value)
	if kvs := responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		o.Prev = kvs[0].ModRevision
		// The acknowledgements still alive (each lives about a ttl; its value says why the
		// term ended): the previous term's among them proves it over without another round
		// trip. They are consumed with it: no term before this one has a successor to wait
		// any more but this one (which, for an older term it inherits, waits for the
		// deadline).
		ack := b.releasedKey(election, o.Prev)
		for _, kv := range responses[3].GetResponseRange().GetKvs() {
			if string(kv.Key) == ack {
				o.PrevReleased, o.PrevWhy = true, string(kv.Value)
			}
		}
	}
	return b.termChecked(at, election, o)
}

// lastTermKey is rewritten by every campaign that creates the election's key, so that its
// mod revision is always the newest term's token (see Observation.Prev). It has no lease:
// it must outlive every term.
func (b *Backend) lastTermKey(election string) string { return b.Key(election) + "/term" }

// Observe implements elector.Backend.
func (b *Backend) Observe(ctx context.Context, election string) (elector.Observation, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return elector.Observation{}, err
	}
	at := b.mark()
	resp, err := cli.Get(leaderCtx(ctx), b.Key(election))
	if err != nil {
		return elector.Observation{}, b.describe(err)
	}
	if err := b.checked(at, resp.Header); err != nil {
		return elector.Observation{}, err
	}
	return b.termChecked(at, election, observation(resp.Header.Revision, resp.Kvs))
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
	if g := b.groupOf(election); g != nil {
		return g.watchGrouped(ctx, election, afterRev, nil, nil)
	}
	out := make(chan elector.Observation, 1)
	go func() {
		defer close(out)
		watchKey(ctx, b, b.Key(election), afterRev, out,
			perEvent(func(at mark, ev *clientv3.Event) (elector.Observation, error) {
				o := elector.Observation{Revision: ev.Kv.ModRevision}
				if ev.Type == clientv3.EventTypePut {
					o.Holder = holder(ev.Kv)
				}
				return b.termChecked(at, election, o)
			}),
			func(err error) elector.Observation { return elector.Observation{Err: err} })
	}()
	return out
}

// WatchSeen implements elector.SeenWatcher: a grouped election's watch takes the holder
// at seen's revision from seen, instead of reading it.
func (b *Backend) WatchSeen(ctx context.Context, election string, seen elector.Observation) <-chan elector.Observation {
	if g := b.groupOf(election); g != nil {
		return g.watchGrouped(ctx, election, seen.Revision, &seen, nil)
	}
	return b.Watch(ctx, election, seen.Revision)
}

// WatchWaking implements elector.WakingWatcher: a grouped election's watch wakes its
// reader from the group's one stream; another's is passed on by a goroutine that does.
func (b *Backend) WatchWaking(ctx context.Context, election string, seen elector.Observation, wake func()) <-chan elector.Observation {
	if g := b.groupOf(election); g != nil {
		return g.watchGrouped(ctx, election, seen.Revision, &seen, wake)
	}
	return elector.PassOnWaking(ctx, b.Watch(ctx, election, seen.Revision), wake)
}

var (
	_ elector.SeenWatcher   = (*Backend)(nil)
	_ elector.WakingWatcher = (*Backend)(nil)
)

// watchKey sends the changes of key (of every key under it, with clientv3.WithPrefix in
// opts) after revision afterRev to out, as change converts each response's events, until
// ctx ends or the watch breaks (or change, given the watch's mark, fails: what it
// converted before is sent first); then it sends broken(the reason) and returns. It
// returns false if ctx ended first.
func watchKey[T any](ctx context.Context, b *Backend, key string, afterRev int64, out chan<- T,
	change func(mark, []*clientv3.Event) ([]T, error), broken func(error) T, opts ...clientv3.OpOption) bool {
	send := func(v T) bool {
		select {
		case out <- v:
			return true
		case <-ctx.Done():
			return false
		}
	}
	cli, err := b.client(ctx)
	if err != nil {
		return send(broken(err))
	}
	at := b.mark()
	rewound, err := b.watchStart(ctx, cli, afterRev)
	if err != nil {
		return send(broken(err))
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := cli.Watch(leaderCtx(wctx), key, append(opts[:len(opts):len(opts)], clientv3.WithRev(afterRev+1))...)
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-rewound:
			// A watch resumed on a rewound store waits for a revision of the old history
			// and may never hear of anything again: it is given up, and read anew.
			return send(broken(errRewoundElsewhere))
		case resp, ok = <-changes:
		}
		switch {
		case !ok && ctx.Err() != nil:
			return false
		case !ok:
			return send(broken(errors.New("etcd watch closed")))
		case resp.Err() != nil:
			return send(broken(b.describe(resp.Err())))
		}
		if err := b.loose(ctx, cli, at, resp.Header); err != nil {
			return send(broken(err))
		}
		values, err := change(at, resp.Events)
		for _, v := range values {
			if !send(v) {
				return false
			}
		}
		if err != nil {
			return send(broken(err))
		}
	}
}

// perEvent is a conversion for watchKey that converts each event on its own.
func perEvent[T any](change func(mark, *clientv3.Event) (T, error)) func(mark, []*clientv3.Event) ([]T, error) {
	return func(at mark, evs []*clientv3.Event) ([]T, error) {
		values := make([]T, 0, len(evs))
		for _, ev := range evs {
			v, err := change(at, ev)
			if err != nil {
				return values, err
			}
			values = append(values, v)
		}
		return values, nil
	}
}

// readThenWatch reads key (every key under it, with clientv3.WithPrefix in opts), sends
// first(what it read), and then its changes as watchKey does, from the read's revision on:
// no change falls between the read and the watch.
func readThenWatch[T any](ctx context.Context, b *Backend, key string, out chan<- T, first func([]*mvccpb.KeyValue) T,
	change func(mark, []*clientv3.Event) ([]T, error), broken func(error) T, opts ...clientv3.OpOption) {
	cli, err := b.client(ctx)
	if err != nil {
		watchKeyFailed(ctx, out, broken(err))
		return
	}
	at := b.mark()
	resp, err := cli.Get(leaderCtx(ctx), key, opts...)
	if err == nil {
		err = b.checked(at, resp.Header)
	} else {
		err = b.describe(err)
	}
	if err != nil {
		watchKeyFailed(ctx, out, broken(err))
		return
	}
	select {
	case out <- first(resp.Kvs):
	case <-ctx.Done():
		return
	}
	watchKey(ctx, b, key, resp.Header.Revision, out, change, broken, opts...)
}

// Update implements elector.Backend: put the new value only if the key is still the same
// term's, keeping the lease it is bound to. A heartbeat of a grouped election puts its
// lease's beacon instead, where it can (beacon.go).
func (b *Backend) Update(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	if g := b.groupOf(election); g != nil {
		if lease, ok := b.written.Heartbeat(election, token, value); ok {
			answer, err := g.beat(ctx, election, token, lease)
			if updated, decided := answer.Decided(); decided || err != nil {
				return updated && err == nil, err
			}
		}
	}
	return b.rewrite(ctx, election, token, value)
}

// rewrite puts value in election's key if the key is still term token's, keeping its
// lease.
func (b *Backend) rewrite(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return false, err
	}
	key := b.Key(election)
	resp, _, err := b.commit(ctx, cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", token)},
		[]clientv3.Op{clientv3.OpPut(key, string(value), clientv3.WithIgnoreLease())}, nil)
	if err != nil {
		return false, err
	}
	if resp.Succeeded {
		b.written.Rewrote(election, token, value)
	}
	return resp.Succeeded, nil
}

// UpdateAll implements elector.HeartbeatBatcher: the heartbeats of a group's keys join
// their lease's next beacon together, so one write answers them all (beacon.go); an
// update the beacon cannot answer is Update's transaction, rewriteParallel at once.
func (b *Backend) UpdateAll(ctx context.Context, updates []elector.KeyUpdate) []elector.UpdateResult {
	return beacon.UpdateAll(ctx, updates, beacon.Heartbeats(&b.groups, &b.written, (*group).addBeat), b.rewrite, rewriteParallel)
}

// rewriteParallel is how many of UpdateAll's own writes are on their way at once.
const rewriteParallel = 32

// Release implements elector.Backend: delete the key only if it is still the same term's,
// and acknowledge the term's end in the same transaction.
func (b *Backend) Release(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	cli, err := b.client(ctx)
	if err != nil {
		return err
	}
	// The acknowledgement is written whether or not the key is still this term's: see
	// elector.Backend.Release.
	return b.acknowledged(ctx, cli, lease, why, func(ack func(string, int64) clientv3.Op) error {
		cmp, then, els := b.releaseTxn(election, token, ack)
		_, _, err := b.commit(ctx, cli, cmp, then, els)
		return err
	})
}

// releaseTxn is the transaction of a release of term token of election: delete the key if
// it is still that term's, and acknowledge the term's end with ack either way.
func (b *Backend) releaseTxn(election string, token int64, ack func(string, int64) clientv3.Op) (cmp []clientv3.Cmp, then, els []clientv3.Op) {
	key := b.Key(election)
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", token)},
		[]clientv3.Op{clientv3.OpDelete(key), ack(election, token)},
		[]clientv3.Op{ack(election, token)}
}

// Expire implements elector.Backend: one transaction that compares the key's create and mod
// revisions.
func (b *Backend) Expire(ctx context.Context, election string, token, rev int64) (bool, error) {
	cli, err := b.client(ctx)
	if err != nil {
		return false, err
	}
	guards, ok, err := b.expireGuards(ctx, cli, election, token, rev)
	if !ok || err != nil {
		return false, err
	}
	resp, _, err := b.commit(ctx, cli, guards, []clientv3.Op{clientv3.OpDelete(b.Key(election))}, nil)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// expireGuards are the conditions of Expire's delete: the key is still term token's and
// unwritten since rev, and, in a group, the holder's beacon too (see expireGuard). ok is
// false when the beacon shows already that the key must stay.
func (b *Backend) expireGuards(ctx context.Context, cli *clientv3.Client, election string, token, rev int64) (guards []clientv3.Cmp, ok bool, err error) {
	key := b.Key(election)
	guards = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", token), clientv3.Compare(clientv3.ModRevision(key), "<", rev+1)}
	if g := b.groupOf(election); g != nil {
		beacon, ok, err := g.expireGuard(ctx, cli, election, token, rev)
		if !ok || err != nil {
			return nil, false, err
		}
		guards = append(guards, beacon)
	}
	return guards, true, nil
}

// Close implements elector.Backend. It ends a connect in progress and waits for it.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.closed = true
	cli := b.cli
	b.cli = nil
	b.mu.Unlock()
	b.cancel()
	b.connects.Wait()
	if cli == nil {
		return nil
	}
	return cli.Close()
}
