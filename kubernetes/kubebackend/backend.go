// Package kubebackend is the elector's Backend on Kubernetes coordination.k8s.io/v1 Lease
// objects, judged expired by their observers' clocks.
package kubebackend

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// A Lease object has no expiry of its own: the API server keeps it until someone deletes
// it. So a lease here is an object that its holder rewrites (Renew) and that any observer
// deletes once it has seen the same resourceVersion for a whole leaseDurationSeconds on its
// own monotonic clock (reaper.go). The delete is conditional on that resourceVersion: a
// renewal that got in first makes it fail, and a renewal after it finds nothing to renew.
// The holder's elector counts its deadline from when it sent its last successful renewal,
// which is before any observer can have seen it: the holder stops before anyone may take
// over, as long as clocks run at about the same rate (the elector keeps a margin for that).
//
// Keys bound to a lease (an election's holder, a candidate's announcement) name the lease
// object; a key whose lease object is gone counts as gone, and whoever notices first
// clears it with a conditional write.

// Config says how to reach the API server and where the objects live.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty means the pod's service account (in-cluster).
	Kubeconfig string
	// Namespace holds every object; empty means the kubeconfig context's namespace, or the
	// service account's, or "default".
	Namespace string
	// Prefix begins every object's name (a DNS name part ending with "-" reads best).
	Prefix string
	// Logger receives what goes wrong in the background (reaping, watches); nil discards it.
	Logger *zap.Logger
}

// DefaultPrefix is the default Config.Prefix.
const DefaultPrefix = "caddy-leader-"

// ErrClosed is returned by requests on a closed Backend.
var ErrClosed = errors.New("kubebackend: closed")

// Backend talks to one API server. It connects lazily, on its first request.
type Backend struct {
	cfg Config

	ctx    context.Context // ends the background work when the backend is closed
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	leases coordclient.LeaseInterface
	// lifeline is a client with a rate limit of its own, for the requests that keep this
	// instance's terms alive (lease renewals, beacons), so that they never queue behind the
	// reads of hundreds of elections being placed: a renewal that waits out the lease's
	// TTL there loses every term, and the fleet starts over.
	lifeline coordclient.LeaseInterface
	// beats is a client with a rate limit of its own for the heartbeats that write an
	// election's key (a plain election's, at every renewal): they keep its term alive, and
	// must not wait behind a shard set's campaigns either, nor crowd the lifeline's
	// renewals (an instance lost its lease every few seconds to a plain election's
	// heartbeat queued behind a set of 256 shards being placed).
	beats  coordclient.LeaseInterface
	ns     string
	closed bool
	reaper *reaper

	// own holds the object of each lease granted here (elector.LeaseID -> *ownLease), so
	// that Renew needs one request.
	own  sync.Map
	revs revisions

	// groups are the groups of elections whose heartbeats share a beacon (beacon.go),
	// and written what this backend last wrote to each election's key.
	groups  beacon.Groups[group]
	written beacon.Written
}

type ownLease struct {
	mu  sync.Mutex
	obj *coordv1.Lease
	ttl time.Duration
}

var _ elector.Backend = (*Backend)(nil)

// New checks cfg and returns a Backend that has not connected yet.
func New(cfg Config) (*Backend, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if err := CheckPrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	b := &Backend{cfg: cfg, revs: newRevisions()}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b, nil
}

// CheckPrefix reports whether p can begin a Lease object's name.
func CheckPrefix(p string) error {
	if len(p) > 100 {
		return fmt.Errorf("prefix %q is longer than 100 characters", p)
	}
	for i, r := range p {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || (r == '-' || r == '.') && i > 0
		if !ok {
			return fmt.Errorf("prefix %q: only lower-case letters, digits, '-' and '.' (not first) may begin an object name", p)
		}
	}
	return nil
}

// Namespace returns the namespace the backend uses, connecting first if it has not.
func (b *Backend) Namespace() (string, error) {
	if _, err := b.client(); err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ns, nil
}

// client returns the Lease client, making it on the first call. Making it only reads files.
func (b *Backend) client() (coordclient.LeaseInterface, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	if b.leases != nil {
		return b.leases, nil
	}
	rc, ns, err := RESTConfig(b.cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if b.cfg.Namespace != "" {
		ns = b.cfg.Namespace
	}
	// client-go's default of 5 requests a second would delay a handover behind renewals.
	rc.QPS, rc.Burst = 50, 100
	rc.UserAgent = "caddy-leader"
	cs, err := coordclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	life, err := coordclient.NewForConfig(rc) // a rate limiter of its own
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	beats, err := coordclient.NewForConfig(rc) // and one more
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	b.lifeline, b.beats = life.Leases(ns), beats.Leases(ns)
	b.leases, b.ns = cs.Leases(ns), ns
	return b.leases, nil
}

// RESTConfig loads the client configuration: from kubeconfig if it is not empty, else the
// pod's service account. It returns the namespace to use by default too.
func RESTConfig(kubeconfig string) (*rest.Config, string, error) {
	if kubeconfig != "" {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
		rc, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		ns, _, err := cc.Namespace()
		if err != nil {
			return nil, "", fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return rc, ns, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, "", fmt.Errorf("in-cluster credentials (set kubeconfig when not running in a pod): %w", err)
	}
	ns := "default"
	if data, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		ns = strings.TrimSpace(string(data))
	}
	return rc, ns, nil
}

// describe names what the API server refused and why, for errors an operator must fix.
func (b *Backend) describe(verb string, err error) error {
	if err == nil {
		return nil
	}
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("kubernetes: not allowed to %s leases.coordination.k8s.io in namespace %q: grant the verb %q in the Role (see deploy/kubernetes/rbac.yaml): %w",
			verb, b.ns, verb, err)
	}
	return fmt.Errorf("kubernetes: %s lease: %w", verb, err)
}

func seconds(ttl time.Duration) int32 {
	s := math.Ceil(ttl.Seconds())
	if s < 1 {
		s = 1
	}
	return int32(min(s, math.MaxInt32))
}

func randomID() elector.LeaseID {
	var buf [8]byte
	rand.Read(buf[:])
	return elector.LeaseID(binary.BigEndian.Uint64(buf[:]) >> 1)
}

// Grant implements elector.Backend: it creates the lease object. Its ttl is rounded up to
// whole seconds (leaseDurationSeconds).
func (b *Backend) Grant(ctx context.Context, ttl time.Duration) (elector.LeaseID, time.Duration, error) {
	leases, err := b.client()
	if err != nil {
		return 0, 0, err
	}
	b.startReaper()
	secs := seconds(ttl)
	for {
		id := randomID()
		if id == 0 {
			continue
		}
		now := metav1.NowMicro()
		obj := &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: b.leaseName(id), Labels: labels(kindLease, "", true)},
			Spec:       coordv1.LeaseSpec{LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}
		at := b.revs.mark()
		got, err := leases.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue // another lease has that id: draw again
		}
		if err != nil {
			return 0, 0, b.describe("create", err)
		}
		if err := b.revs.check(at, got.ResourceVersion); err != nil {
			return 0, 0, err
		}
		granted := time.Duration(secs) * time.Second
		b.own.Store(id, &ownLease{obj: got, ttl: granted})
		return id, granted, nil
	}
}

// lifelineKey marks a context whose requests go through the lifeline client: a set's
// heartbeat that writes its key (the beacon could not answer it) keeps a term alive as a
// beacon does, and must not wait behind the set's campaigns for the general client's rate
// limit (a set of 64 shards lost every term that way, again and again).
type lifelineKey struct{}

// onLifeline returns ctx marked for the lifeline client.
func onLifeline(ctx context.Context) context.Context {
	return context.WithValue(ctx, lifelineKey{}, "lifeline")
}

// onBeats returns ctx marked for the heartbeats' client (see Backend.beats).
func onBeats(ctx context.Context) context.Context {
	return context.WithValue(ctx, lifelineKey{}, "beats")
}

// clientFor returns the client for a request under ctx: the lifeline client if ctx is
// marked for it (onLifeline), the heartbeats' (onBeats), the general one otherwise.
func (b *Backend) clientFor(ctx context.Context) (coordclient.LeaseInterface, error) {
	switch ctx.Value(lifelineKey{}) {
	case "lifeline":
		return b.lifelineClient()
	case "beats":
		if _, err := b.client(); err != nil {
			return nil, err
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.beats, nil
	}
	return b.client()
}

// lifelineClient returns the client for renewals and beacons (see Backend.lifeline).
func (b *Backend) lifelineClient() (coordclient.LeaseInterface, error) {
	if _, err := b.client(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lifeline, nil
}

// Renew implements elector.Backend: it rewrites the lease object's renewTime, on condition
// that it is the version last seen, so that a reaper's delete and a renewal never both
// succeed.
func (b *Backend) Renew(ctx context.Context, id elector.LeaseID) (time.Duration, error) {
	leases, err := b.lifelineClient()
	if err != nil {
		return 0, err
	}
	v, _ := b.own.LoadOrStore(id, &ownLease{})
	ol := v.(*ownLease)
	ol.mu.Lock()
	defer ol.mu.Unlock()
	for range 3 {
		if ol.obj == nil {
			got, err := leases.Get(ctx, b.leaseName(id), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				b.own.Delete(id)
				b.leaseGone(id)
				return 0, elector.ErrLeaseNotFound
			}
			if err != nil {
				return 0, b.describe("get", err)
			}
			ol.obj = got
		}
		obj := ol.obj.DeepCopy()
		now := metav1.NowMicro()
		obj.Spec.RenewTime = &now
		at := b.revs.mark()
		got, err := leases.Update(ctx, obj, metav1.UpdateOptions{})
		switch {
		case apierrors.IsNotFound(err):
			b.own.Delete(id)
			b.leaseGone(id)
			return 0, elector.ErrLeaseNotFound
		case apierrors.IsConflict(err):
			ol.obj = nil // reaped (then Get says so) or edited by an operator: read again
			continue
		case err != nil:
			return 0, b.describe("update", err)
		}
		if err := b.revs.check(at, got.ResourceVersion); err != nil {
			return 0, err
		}
		ol.obj = got
		ttl := time.Duration(*seconds32(got.Spec.LeaseDurationSeconds)) * time.Second
		return ttl, nil
	}
	return 0, fmt.Errorf("kubernetes: lease %s keeps changing under its renewal", b.leaseName(id))
}

// seconds32 returns d, or a pointer to 1 when an operator removed it.
func seconds32(d *int32) *int32 {
	if d == nil || *d < 1 {
		one := int32(1)
		return &one
	}
	return d
}

// Revoke implements elector.Backend: it deletes the lease object, then the keys bound to
// it. A key left behind by a revoker that dies in between counts as gone anyway.
func (b *Backend) Revoke(ctx context.Context, id elector.LeaseID) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	err = leases.Delete(ctx, b.leaseName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return b.describe("delete", err)
	}
	b.own.Delete(id)
	b.leaseGone(id)
	return b.unbind(ctx, id)
}

// unbind clears the election keys and deletes the announcements bound to lease id, which
// is gone.
func (b *Backend) unbind(ctx context.Context, id elector.LeaseID) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy + "," + labelLease + "=" + leaseHex(id)})
	if err != nil {
		return b.describe("list", err)
	}
	// Beacons go last, once the keys they vouched for are cleared.
	for _, last := range []bool{false, true} {
		for i := range list.Items {
			obj := &list.Items[i]
			switch kind := obj.Labels[labelKind]; {
			case last != (kind == kindBeacon):
			case kind == kindElection:
				_, err = b.vacate(ctx, obj)
			case kind == kindCandidate, kind == kindBeacon:
				err = b.deleteAt(ctx, obj)
			}
			if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return b.describe("update", err)
			}
		}
	}
	return nil
}

// deleteAt deletes obj if it is still at its resourceVersion.
func (b *Backend) deleteAt(ctx context.Context, obj *coordv1.Lease) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	rv := obj.ResourceVersion
	return leases.Delete(ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
}

// alive reports whether lease id's object exists. A lease whose holder stopped renewing
// exists until an observer has waited out its duration and deleted it. A lease the
// reaper's watch shows is alive without a request: its delete may not have reached the
// watch yet, which is the answer a get sent a moment earlier would give (every caller
// takes that race already). One it does not show is asked for, since it may be newer
// than the watch. A shard set's campaigns read the few leases of a fleet thousands of
// times, and these gets were most of what kept a large set from being placed.
func (b *Backend) alive(ctx context.Context, id elector.LeaseID) (bool, error) {
	if id == 0 {
		return false, nil
	}
	b.mu.Lock()
	r := b.reaper
	b.mu.Unlock()
	if r != nil && r.shows(b.leaseName(id)) {
		return true, nil
	}
	leases, err := b.clientFor(ctx)
	if err != nil {
		return false, err
	}
	_, err = leases.Get(ctx, b.leaseName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, b.describe("get", err)
	}
	return true, nil
}

// leaseGone tells the reaper that lease id is gone (this backend revoked it, or the API
// server said so), ahead of its watch: alive must not take it for alive from then on.
func (b *Backend) leaseGone(id elector.LeaseID) {
	b.mu.Lock()
	r := b.reaper
	b.mu.Unlock()
	if r != nil {
		r.forget(b.leaseName(id))
	}
}

// getNamed reads the object called name with a consistent list, whose resourceVersion is
// the store's revision as of the read (a get's would be the object's). obj is nil when
// there is no such object.
func (b *Backend) getNamed(ctx context.Context, at mark, name string) (obj *coordv1.Lease, rev int64, err error) {
	leases, err := b.clientFor(ctx)
	if err != nil {
		return nil, 0, err
	}
	list, err := leases.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return nil, 0, b.describe("list", err)
	}
	if err := b.revs.check(at, list.ResourceVersion); err != nil {
		return nil, 0, err
	}
	rev, err = parseRV(list.ResourceVersion)
	if err != nil {
		return nil, 0, err
	}
	if len(list.Items) == 0 {
		return nil, rev, nil
	}
	return &list.Items[0], rev, nil
}

// parseRV reads a resourceVersion as the etcd revision it is on every API server backed by
// etcd. The store relies on that: it is how fencing tokens rise across re-created objects.
func parseRV(rv string) (int64, error) {
	v, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("kubernetes: resourceVersion %q is not a positive integer: this store needs an API server whose storage is etcd", rv)
	}
	return v, nil
}

// Close implements elector.Backend. It stops the background work and waits for it.
func (b *Backend) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
	return nil
}
