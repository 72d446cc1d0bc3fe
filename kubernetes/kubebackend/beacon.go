package kubebackend

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/beacon"
)

// Grouped heartbeats (elector.HeartbeatGrouper). The election objects of a group (a shard
// set, <group>.<n>) carry the group's label, and so does one beacon object per lease,
// <prefix><group>-<hash>-beacon-<lease>. A heartbeat of a key that holds the value last
// written rewrites the lease's beacon instead of the key: one update per lease and renewal
// for all the keys the lease holds in the group.
//
// One watch of the group's label (a groupStream, groupwatch.go) shows the election objects
// and the beacons in the order of their resourceVersions, which are etcd's revisions. It
// serves every Watch of the group's elections, reporting a beacon as a change of each key
// its lease holds, and tells a heartbeat whether its key was still the term's at the
// beacon's revision.
//
// The API server changes one object per request, so Expire cannot compare the key and the
// beacon in one transaction as etcd does. It takes the beacon first: a conditional update
// that records the key's resourceVersion under annExpiring ("this version of the key is
// being expired") and keeps, in annLastBeacon, the revision of the holder's last beacon
// before it, and it goes on only if that beacon is no later than the revision the caller
// saw. Then it clears the key, on condition that the key is still at that version. Every
// later write of the beacon keeps annExpiring (all writes of a beacon are conditional
// read-modify-writes), and a beacon counts for a key only if it does not name the key's
// version there: so a holder's beacon either comes before the expiry's update, and then at
// or before the caller's revision, or after it, and then it does not count, and the holder
// writes the key itself, which makes the clearing fail. A key's version only rises, so an
// entry naming an older version is moot and the holder drops it. Where the lease has no
// beacon yet, Expire creates it, with its entry: of that create and the holder's, one
// fails and reads the other's.
//
// A beacon object is deleted once its lease is gone (unbind), after the keys it vouched for
// are cleared and on condition that it is still the version listed: every entry it had
// then names a key that is cleared or has moved on. An operator who deletes a beacon by
// hand takes those entries, and the revision of the holder's last beacon, with it: as
// deleting an etcd beacon key by hand would, that may let an Expire in flight clear a key
// whose holder's later beacon counted.

// GroupHeartbeats implements elector.HeartbeatGrouper.
func (b *Backend) GroupHeartbeats(name string) {
	b.groups.Join(name, func() *group {
		g := &group{b: b, name: name, beacons: map[elector.LeaseID]*coordv1.Lease{}}
		g.beats = beacon.Batcher[int64]{Mu: &g.mu, Send: g.sendBeacon}
		return g
	})
}

// groupOf returns the group of election, nil if it has none.
func (b *Backend) groupOf(election string) *group { return b.groups.Of(election) }

// labelGroup labels obj, an election object, with its group, if it has one.
func (b *Backend) labelGroup(obj *coordv1.Lease, election string) {
	if g := b.groupOf(election); g != nil {
		if obj.Labels == nil {
			obj.Labels = map[string]string{}
		}
		obj.Labels[labelGroup] = hash(g.name)
	}
}

// beatGrouped answers a heartbeat of election's term token with value from a beacon,
// where it can: handled is false when the key must be written instead.
func (b *Backend) beatGrouped(ctx context.Context, election string, token int64, value []byte) (ok, handled bool, err error) {
	g := b.groupOf(election)
	if g == nil {
		return false, false, nil
	}
	lease, ok := b.written.Heartbeat(election, token, value)
	if !ok {
		return false, false, nil
	}
	answer, err := g.beat(ctx, election, token, lease)
	updated, decided := answer.Decided()
	return updated && err == nil, decided || err != nil, err
}

type group struct {
	b    *Backend
	name string

	mu    sync.Mutex
	st    *groupStream          // nil while no Watch of the group runs
	beats beacon.Batcher[int64] // heartbeats by lease: election -> token
	// beacons holds the beacon object of each lease as this backend last wrote it, so
	// that a beacon takes one request.
	beacons map[elector.LeaseID]*coordv1.Lease
	// seen is each election's object as this backend's last read or campaign of it found
	// it (objectAt).
	seen map[string]seenObject
}

func (g *group) beaconName(lease elector.LeaseID) string {
	return g.b.electionName(g.name) + "-beacon-" + leaseHex(lease)
}

// selector selects the group's election objects and beacons.
func (g *group) selector() metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy + "," + labelGroup + "=" + hash(g.name)}
}

// beaconState is what a beacon object says.
type beaconState struct {
	lease elector.LeaseID
	// holders is false for a write by an Expire, which is no heartbeat.
	holders bool
	// expiring names the version of each key an Expire is clearing.
	expiring map[string]int64
}

// counts reports whether the beacon is a heartbeat of election's key, whose version (its
// resourceVersion) is version.
func (bc *beaconState) counts(election string, version int64) bool {
	return bc.holders && bc.expiring[election] != version
}

// decodeBeacon reads a beacon object; ok is false for an object that is none.
func decodeBeacon(obj *coordv1.Lease) (bc beaconState, ok bool) {
	id, err := strconv.ParseUint(obj.Labels[labelLease], 16, 64)
	if obj.Labels[labelKind] != kindBeacon || err != nil || id == 0 || id > 1<<63-1 {
		return bc, false
	}
	bc.lease = elector.LeaseID(id)
	_, expiry := obj.Annotations[annLastBeacon]
	bc.holders = !expiry
	bc.expiring = map[string]int64{}
	if data := obj.Annotations[annExpiring]; data != "" {
		_ = json.Unmarshal([]byte(data), &bc.expiring) // unreadable: no entries, and no version is 0
	}
	return bc, true
}

func setExpiring(obj *coordv1.Lease, expiring map[string]int64) {
	if len(expiring) == 0 {
		delete(obj.Annotations, annExpiring)
		return
	}
	data, _ := json.Marshal(expiring)
	obj.Annotations[annExpiring] = string(data)
}

// beaconTimeout bounds one write of a beacon.
const beaconTimeout = 5 * time.Second

// putBeacon writes lease's beacon and returns the revision of the write. It keeps what
// Expires recorded there, but for the versions of keys that have moved on (moot).
func (g *group) putBeacon(lease elector.LeaseID) (int64, error) {
	ctx, cancel := context.WithTimeout(g.b.ctx, beaconTimeout)
	defer cancel()
	leases, err := g.b.lifelineClient()
	if err != nil {
		return 0, err
	}
	name := g.beaconName(lease)
	for range 5 {
		g.mu.Lock()
		cur := g.beacons[lease]
		g.mu.Unlock()
		if cur == nil {
			cur, err = leases.Get(ctx, name, metav1.GetOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return 0, g.b.describe("get", err)
			}
			if err != nil {
				cur = nil
			}
		}
		holder := g.b.leaseName(lease)
		now := metav1.NowMicro()
		at := g.b.revs.mark()
		var got *coordv1.Lease
		if cur == nil {
			obj := g.newBeacon(lease)
			obj.Spec.RenewTime = &now
			got, err = leases.Create(ctx, obj, metav1.CreateOptions{})
		} else {
			obj := cur.DeepCopy()
			if obj.Annotations == nil {
				obj.Annotations = map[string]string{}
			}
			delete(obj.Annotations, annLastBeacon)
			bc, _ := decodeBeacon(obj)
			setExpiring(obj, g.live(bc))
			obj.Spec.HolderIdentity, obj.Spec.RenewTime = &holder, &now
			got, err = leases.Update(ctx, obj, metav1.UpdateOptions{})
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			g.mu.Lock()
			delete(g.beacons, lease) // an Expire wrote it, or it was deleted: read it again
			g.mu.Unlock()
			continue
		}
		if err != nil {
			return 0, g.b.describe("update", err)
		}
		if err := g.b.revs.check(at, got.ResourceVersion); err != nil {
			return 0, err
		}
		g.mu.Lock()
		g.beacons[lease] = got
		g.mu.Unlock()
		return parseRV(got.ResourceVersion)
	}
	return 0, errBeaconContended
}

// errBeaconContended: others kept writing the beacon between a read and the write made
// from it (Expires, for a heartbeat, which then writes its key instead; heartbeats or other
// Expires, for an Expire, which gives up and lets its caller try again later).
var errBeaconContended = errors.New("kubernetes: the beacon keeps changing under its write")

// holdTries bounds the tries of holdBeacon, and holdPause is the pause before its second
// try, doubled before each next one: a beacon that changes at every try (heartbeats of
// many keys, other followers expiring them) costs an Expire five round trips at most,
// spread over about a second, and its caller's own retry decides when to look again.
const (
	holdTries = 5
	holdPause = 50 * time.Millisecond
)

// live keeps the entries of bc.expiring that may still matter: those of keys whose
// version the stream has not shown moving past them.
func (g *group) live(bc beaconState) map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]int64{}
	for election, version := range bc.expiring {
		if g.st != nil && g.st.movedPast(election, version) {
			continue
		}
		out[election] = version
	}
	return out
}

// holdBeacon is Expire's first step for a key of the group at version, held under lease:
// it records the version in the lease's beacon, on condition that the holder's last beacon
// there is no later than rev. It reports whether Expire may go on and clear the key. After
// holdTries conflicting writes it gives up with errBeaconContended.
func (g *group) holdBeacon(ctx context.Context, election string, lease elector.LeaseID, version, rev int64) (bool, error) {
	leases, err := g.b.client()
	if err != nil {
		return false, err
	}
	name := g.beaconName(lease)
	for try := range holdTries {
		if try > 0 {
			sleep(ctx, holdPause<<(try-1))
		}
		cur, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return false, g.b.describe("get", err)
		}
		var obj *coordv1.Lease
		last := int64(0) // the lease has written no beacon
		if err != nil {
			cur, obj = nil, g.newBeacon(lease)
		} else {
			if last, err = parseRV(cur.ResourceVersion); err != nil {
				return false, err
			}
			if v, ok := cur.Annotations[annLastBeacon]; ok {
				last, _ = strconv.ParseInt(v, 10, 64)
			}
			if _, ok := decodeBeacon(cur); !ok {
				return false, nil
			}
			obj = cur.DeepCopy()
			if obj.Annotations == nil {
				obj.Annotations = map[string]string{}
			}
		}
		if last > rev {
			return false, nil // the holder wrote a beacon after rev
		}
		bc, _ := decodeBeacon(obj)
		bc.expiring[election] = version
		setExpiring(obj, bc.expiring)
		obj.Annotations[annLastBeacon] = strconv.FormatInt(last, 10)
		at := g.b.revs.mark()
		var got *coordv1.Lease
		if cur == nil {
			got, err = leases.Create(ctx, obj, metav1.CreateOptions{})
		} else {
			got, err = leases.Update(ctx, obj, metav1.UpdateOptions{})
		}
		switch {
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err):
			continue
		case err != nil:
			return false, g.b.describe("update", err)
		}
		return true, g.b.revs.check(at, got.ResourceVersion)
	}
	return false, errBeaconContended
}

// newBeacon is lease's beacon object before its first write.
func (g *group) newBeacon(lease elector.LeaseID) *coordv1.Lease {
	l := labels(kindBeacon, "", false)
	l[labelGroup], l[labelLease] = hash(g.name), leaseHex(lease)
	holder := g.b.leaseName(lease)
	return &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: g.beaconName(lease), Labels: l, Annotations: map[string]string{annGroup: g.name}},
		Spec:       coordv1.LeaseSpec{HolderIdentity: &holder},
	}
}

var (
	_ elector.HeartbeatGrouper = (*Backend)(nil)
	_ elector.HeartbeatBatcher = (*Backend)(nil)
)
