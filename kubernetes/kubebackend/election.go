package kubebackend

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/elector"
)

// An election is one Lease object, never deleted by the store: holderIdentity names the
// holder's lease object, the annotations carry the token and the value, and
// leaseTransitions, acquireTime and leaseDurationSeconds are kept for kubectl's readers.
// It is vacant when holderIdentity is empty or names a lease object that is gone.
//
// A new term's token is the store's revision as its campaign read it, plus one: the term
// before it was written at that revision or earlier (its token is at most its write's
// revision), and the campaign's write is conditional on nothing having changed since the
// read. So tokens rise with etcd's revision, across an operator's delete and re-create of
// the object too, where the object's own leaseTransitions would start again.

// holderOf decodes the holder of an election object; nil when it is vacant by its fields.
func (b *Backend) holderOf(obj *coordv1.Lease) *elector.Holder {
	if obj == nil || obj.Spec.HolderIdentity == nil || *obj.Spec.HolderIdentity == "" {
		return nil
	}
	id, _ := b.leaseID(*obj.Spec.HolderIdentity)
	token, _ := strconv.ParseInt(obj.Annotations[annToken], 10, 64)
	value, _ := base64.StdEncoding.DecodeString(obj.Annotations[annValue])
	return &elector.Holder{Value: value, Lease: id, Token: token}
}

// vacate clears obj's holder if obj is still at its resourceVersion.
func (b *Backend) vacate(ctx context.Context, obj *coordv1.Lease) (*coordv1.Lease, error) {
	leases, err := b.clientFor(ctx)
	if err != nil {
		return nil, err
	}
	obj = obj.DeepCopy()
	obj.Spec.HolderIdentity = nil
	delete(obj.Labels, labelLease)
	delete(obj.Annotations, annValue)
	return leases.Update(ctx, obj, metav1.UpdateOptions{})
}

// read returns election's current state, clearing a holder whose lease is gone first.
func (b *Backend) read(ctx context.Context, election string) (elector.Observation, *coordv1.Lease, error) {
	for {
		at := b.revs.mark()
		obj, rev, err := b.getNamed(ctx, at, b.electionName(election))
		if err != nil {
			return elector.Observation{}, nil, err
		}
		h := b.holderOf(obj)
		if h != nil {
			ok, err := b.alive(ctx, h.Lease)
			if err != nil {
				return elector.Observation{}, nil, err
			}
			if !ok {
				if _, err := b.vacate(ctx, obj); err != nil && !apierrors.IsConflict(err) {
					return elector.Observation{}, nil, b.describe("update", err)
				}
				continue
			}
			if err := b.revs.term(at, election, h.Token, rev); err != nil {
				return elector.Observation{}, nil, err
			}
		}
		b.noteObject(at, election, rev, obj)
		return elector.Observation{Revision: rev, Holder: h}, obj, nil
	}
}

// Observe implements elector.Backend.
func (b *Backend) Observe(ctx context.Context, election string) (elector.Observation, error) {
	b.startReaper()
	o, _, err := b.read(ctx, election)
	return o, err
}

// Campaign implements elector.Backend: a create, or an update conditional on the vacant
// state read just before; of concurrent campaigns the API server lets one through.
func (b *Backend) Campaign(ctx context.Context, election string, value []byte, lease elector.LeaseID) (elector.Observation, error) {
	leases, err := b.client()
	if err != nil {
		return elector.Observation{}, err
	}
	b.startReaper()
	ttl := time.Duration(0)
	if v, ok := b.own.Load(lease); ok {
		ttl = v.(*ownLease).ttl
	}
	for {
		ok, err := b.alive(ctx, lease)
		if err != nil {
			return elector.Observation{}, err
		}
		if !ok {
			return elector.Observation{}, elector.ErrLeaseNotFound
		}
		o, obj, err := b.read(ctx, election)
		if err != nil || o.Holder != nil {
			return o, err
		}
		token := o.Revision + 1
		// A vacated object still names the term that held it last: the campaign names
		// it as Prev, so that the new holder waits for that very term and never takes
		// its own earlier term for the last one (an object deleted by an operator names
		// none, and the new holder then waits out every term it did not see).
		var (
			prev         int64
			prevReleased bool
			prevWhy      string
		)
		if obj != nil {
			prev, _ = strconv.ParseInt(obj.Annotations[annToken], 10, 64)
			prevWhy, prevReleased = releasedBy(obj, prev)
		}
		at := b.revs.mark()
		now := metav1.NowMicro()
		holder := b.leaseName(lease)
		var got *coordv1.Lease
		if obj == nil {
			obj = &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{
				Name: b.electionName(election), Labels: labels(kindElection, election, false),
				Annotations: map[string]string{annElection: election},
			}}
		} else {
			obj = obj.DeepCopy()
			forgetRelease(obj) // this campaign consumes it, as Released does
			transitions := int32(0)
			if obj.Spec.LeaseTransitions != nil {
				transitions = *obj.Spec.LeaseTransitions + 1
			}
			obj.Spec.LeaseTransitions = &transitions
		}
		if obj.Labels == nil {
			obj.Labels = map[string]string{}
		}
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Labels[labelLease] = leaseHex(lease)
		b.labelGroup(obj, election)
		obj.Annotations[annToken] = strconv.FormatInt(token, 10)
		obj.Annotations[annValue] = base64.StdEncoding.EncodeToString(value)
		obj.Spec.HolderIdentity = &holder
		obj.Spec.AcquireTime, obj.Spec.RenewTime = &now, &now
		if ttl > 0 {
			secs := seconds(ttl)
			obj.Spec.LeaseDurationSeconds = &secs
		}
		if obj.ResourceVersion == "" {
			got, err = leases.Create(ctx, obj, metav1.CreateOptions{})
		} else {
			got, err = leases.Update(ctx, obj, metav1.UpdateOptions{})
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			continue // someone else wrote first: read who
		}
		if err != nil {
			return elector.Observation{}, b.describe("update", err)
		}
		if err := b.revs.check(at, got.ResourceVersion); err != nil {
			return elector.Observation{}, err
		}
		rev, _ := parseRV(got.ResourceVersion)
		if err := b.revs.term(at, election, token, rev); err != nil {
			return elector.Observation{}, err
		}
		b.written.Won(election, token, lease, value)
		b.noteObject(at, election, rev, got)
		return elector.Observation{Revision: rev, Holder: &elector.Holder{Value: value, Lease: lease, Token: token},
			Prev: prev, PrevReleased: prevReleased, PrevWhy: prevWhy}, nil
	}
}

// consumeRelease removes the election object's note that term token released it, if it
// says so, with a write conditional on the object read; it reports whether it did, and why
// the term ended.
func (b *Backend) consumeRelease(ctx context.Context, election string, token int64) (string, bool, error) {
	leases, err := b.client()
	if err != nil {
		return "", false, err
	}
	for {
		at := b.revs.mark()
		obj, _, err := b.getNamed(ctx, at, b.electionName(election))
		if err != nil {
			return "", false, err
		}
		why, ok := releasedBy(obj, token)
		if !ok {
			return "", false, nil
		}
		obj = obj.DeepCopy()
		forgetRelease(obj)
		got, err := leases.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return "", false, b.describe("update", err)
		}
		return why, true, b.revs.check(at, got.ResourceVersion)
	}
}

// forgetRelease removes obj's note of the term that released it.
func forgetRelease(obj *coordv1.Lease) {
	delete(obj.Annotations, annReleased)
	delete(obj.Annotations, annWhy)
}

// releasedBy reports whether election object obj says that term token released it (see
// Release), and why. The next campaign consumes the note, as Released does.
func releasedBy(obj *coordv1.Lease, token int64) (why string, ok bool) {
	if obj == nil || token == 0 || obj.Annotations[annReleased] != strconv.FormatInt(token, 10) {
		return "", false
	}
	return obj.Annotations[annWhy], true
}

// Update implements elector.Backend. A heartbeat of a grouped election writes its lease's
// beacon instead, where it can (beacon.go).
func (b *Backend) Update(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	if ok, handled, err := b.beatGrouped(ctx, election, token, value); handled {
		return ok, err
	}
	return b.rewrite(ctx, election, token, value)
}

// rewrite is Update without a beacon: a write of the key's object, if it still holds term
// token.
func (b *Backend) rewrite(ctx context.Context, election string, token int64, value []byte) (bool, error) {
	if b.groupOf(election) != nil {
		// A heartbeat of a set's shard that writes its key (the beacon could not answer
		// it: its watch is not up yet, say) keeps the term alive as a beacon does: it
		// goes through the lifeline client, not behind the set's campaigns.
		ctx = onLifeline(ctx)
	} else {
		// A plain election's heartbeats write their keys every time: they go through a
		// client of their own, off the lifeline, which its renewals need, and not behind
		// a set's campaigns either.
		ctx = onBeats(ctx)
	}
	ok, err := b.updateHeld(ctx, election, token, 0, func(obj *coordv1.Lease) {
		obj.Annotations[annValue] = base64.StdEncoding.EncodeToString(value)
		b.labelGroup(obj, election)
		// The API server skips an update that changes nothing, and then no watcher hears of
		// it; the elector's heartbeats rewrite the same value and must be seen. renewTime
		// makes every update a write (and tells kubectl's readers when the holder last beat).
		now := metav1.NowMicro()
		obj.Spec.RenewTime = &now
	})
	if ok {
		b.written.Rewrote(election, token, value)
	}
	return ok, err
}

// updateHeld reads election's object and, if it holds term token, writes it back changed
// by change, at the resourceVersion read: a write that loses to another (a conflict) reads
// again, at most tries times (no bound if 0). It reports whether it wrote; an error after
// a write is the rewind check's.
func (b *Backend) updateHeld(ctx context.Context, election string, token int64, tries int, change func(*coordv1.Lease)) (bool, error) {
	leases, err := b.clientFor(ctx)
	if err != nil {
		return false, err
	}
	for try := 1; tries == 0 || try <= tries; try++ {
		o, obj, err := b.read(ctx, election)
		if err != nil {
			return false, err
		}
		if o.Holder == nil || o.Holder.Token != token {
			return false, nil
		}
		obj = obj.DeepCopy()
		change(obj)
		at := b.revs.mark()
		got, err := leases.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return false, b.describe("update", err)
		}
		return true, b.revs.check(at, got.ResourceVersion)
	}
	return false, fmt.Errorf("kubernetes: lease %s kept changing under %d writes", b.electionName(election), tries)
}

// Release implements elector.Backend. A term that still holds the key is acknowledged in
// the write that vacates it (the object keeps the released term's token and why, see
// releasedBy), so a handover is one write, and the successor's campaign, which reads the
// vacant object, learns of the acknowledgement without another request. A term that no
// longer holds it gets an acknowledgement object of its own (Acknowledge): only the term's
// holder releases it, so that acknowledgement is true too.
func (b *Backend) Release(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	for {
		o, obj, err := b.read(ctx, election)
		if err != nil {
			return err
		}
		if o.Holder == nil || o.Holder.Token != token {
			return b.Acknowledge(ctx, election, token, lease, why)
		}
		at := b.revs.mark()
		obj = obj.DeepCopy()
		obj.Annotations[annReleased] = strconv.FormatInt(token, 10)
		if why != "" {
			obj.Annotations[annWhy] = why
		} else {
			delete(obj.Annotations, annWhy)
		}
		got, err := b.vacate(ctx, obj)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return b.describe("update", err)
		}
		return b.revs.check(at, got.ResourceVersion)
	}
}

// Acknowledge implements elector.Backend with an object of its own that expires (by its
// observers, see reaper.go) after the lease's duration; an annotation says why (none in
// the acknowledgements of earlier releases).
func (b *Backend) Acknowledge(ctx context.Context, election string, token int64, lease elector.LeaseID, why string) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	secs := int32(60)
	if v, ok := b.own.Load(lease); ok && v.(*ownLease).ttl > 0 {
		secs = seconds(v.(*ownLease).ttl)
	}
	obj := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: b.ackName(election, token), Labels: labels(kindAck, election, true),
			Annotations: map[string]string{annElection: election, annToken: strconv.FormatInt(token, 10)}},
		Spec: coordv1.LeaseSpec{LeaseDurationSeconds: &secs},
	}
	if why != "" {
		obj.Annotations[annWhy] = why
	}
	_, err = leases.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return b.describe("create", err)
	}
	return nil
}

// Released implements elector.Backend: an acknowledgement object, or else the election
// object's note of the term released last (see Release); either is consumed. The object is
// read first, for its why: a delete does not return the object deleted. The delete is
// conditional on that very object, so that of two readers only one consumes it.
func (b *Backend) Released(ctx context.Context, election string, token int64, lease elector.LeaseID) (bool, string, error) {
	leases, err := b.client()
	if err != nil {
		return false, "", err
	}
	name := b.ackName(election, token)
	ack, err := leases.Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		err = leases.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ack.UID}})
		if err == nil {
			return true, ack.Annotations[annWhy], nil
		}
		if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return false, "", b.describe("delete", err)
		}
	case !apierrors.IsNotFound(err):
		return false, "", b.describe("get", err)
	}
	if why, ok, err := b.consumeRelease(ctx, election, token); ok || err != nil {
		return ok, why, err
	}
	if lease == 0 {
		return false, "", nil
	}
	ok, err := b.alive(ctx, lease)
	return !ok && err == nil, "", err
}

// Watch implements elector.Backend with a watch of the election object, resumed from its
// last resourceVersion when the API server ends it, and read afresh on 410 Gone. While
// the key is held, the holder's lease object is followed too (reaper.go): when it goes,
// the key is cleared, and that write is the change reported. A grouped election's Watch
// is served by its group's one watch (groupwatch.go).
func (b *Backend) Watch(ctx context.Context, election string, afterRev int64) <-chan elector.Observation {
	if g := b.groupOf(election); g != nil {
		return g.watchGrouped(ctx, election, afterRev)
	}
	out := make(chan elector.Observation, 1)
	b.startReaper()
	w := &watcher{b: b, election: election, out: out, last: afterRev}
	runWatch(ctx, b, out, func(err error) elector.Observation { return elector.Observation{Err: err} }, w.run)
	return out
}

type watcher struct {
	b        *Backend
	election string
	out      chan<- elector.Observation
	last     int64          // the revision last reported (or afterRev)
	cur      *coordv1.Lease // the newest version of the object seen
	gone     <-chan struct{}
}

func (w *watcher) send(ctx context.Context, o elector.Observation) error {
	if o.Revision <= w.last {
		return nil
	}
	select {
	case w.out <- o:
		w.last = o.Revision
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// follow notes obj as the newest version and follows its holder's lease.
func (w *watcher) follow(ctx context.Context, obj *coordv1.Lease) {
	w.cur, w.gone = obj, nil
	if h := w.b.holderOf(obj); h != nil {
		w.gone = w.b.reaper.gone(ctx, w.b.leaseName(h.Lease))
	}
}

func (w *watcher) run(ctx context.Context) error {
	leases, err := w.b.client()
	if err != nil {
		return err
	}
	name := w.b.electionName(w.election)
	// The current state tells whose lease to follow; changes after afterRev come from the
	// watch.
	_, obj, err := w.b.read(ctx, w.election)
	if err != nil {
		return err
	}
	if obj != nil {
		w.follow(ctx, obj)
	}
	from := w.last
	if from <= 0 {
		if from, err = w.relist(ctx); err != nil {
			return err
		}
	}
	return w.b.watchOn(ctx, leases, namedOpts(name), from, watchGap, w.events)
}

// errWatchGap ends a watch whose resume point the API server no longer keeps (410 Gone).
// Listing again would report the current state as if every change before it had been
// watched, merging a vacancy with heartbeats nobody saw (see elector.Backend.Watch); the
// elector reads the key instead, which says honestly that changes may have been missed.
var errWatchGap = errors.New("kubernetes: the watch fell behind the API server's history (410 Gone); changes in between are unknown")

// watchGap is the election watch's answer to 410 Gone: it breaks with errWatchGap.
func watchGap(context.Context) (int64, error) { return 0, errWatchGap }

// relist reports the current state if it is newer than the last report, and returns the
// revision to watch from.
func (w *watcher) relist(ctx context.Context) (int64, error) {
	o, obj, err := w.b.read(ctx, w.election)
	if err != nil {
		return 0, err
	}
	w.follow(ctx, obj)
	return o.Revision, w.send(ctx, o)
}

// events handles one watch's events until it ends; it returns the revision to resume from.
func (w *watcher) events(ctx context.Context, ch <-chan event, from int64) (int64, error) {
	for {
		select {
		case <-ctx.Done():
			return from, ctx.Err()
		case <-w.gone:
			// The holder's lease went: clear the key if nobody changed it since, and report
			// the write when the watch brings it.
			w.gone = nil
			if _, err := w.b.vacate(ctx, w.cur); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return from, w.b.describe("update", err)
			}
		case ev, ok := <-ch:
			if ended, next, err := w.b.watchEnded(ctx, ev, ok, from, watchGap); ended {
				return next, err
			}
			from = max(from, ev.rev)
			if ev.obj == nil {
				continue // a bookmark
			}
			if ev.deleted {
				w.cur, w.gone = nil, nil
				if err := w.send(ctx, elector.Observation{Revision: ev.rev}); err != nil {
					return from, err
				}
				continue
			}
			w.follow(ctx, ev.obj)
			h := w.b.holderOf(ev.obj)
			if h != nil {
				select {
				case <-w.gone:
					continue // held by a lease that is gone: the case above clears it
				default:
				}
			}
			if err := w.send(ctx, elector.Observation{Revision: ev.rev, Holder: h}); err != nil {
				return from, err
			}
		}
	}
}

// Expire implements elector.Backend: the election object is cleared only if it still names
// term token and its resourceVersion is no later than rev, and the update carries that
// resourceVersion, so a write made since (a heartbeat) makes it fail with a conflict. For a
// grouped election, the holder's beacon is taken first (beacon.go).
func (b *Backend) Expire(ctx context.Context, election string, token, rev int64) (bool, error) {
	o, obj, err := b.read(ctx, election)
	if err != nil || o.Holder == nil || o.Holder.Token != token {
		return false, err
	}
	objRev, err := parseRV(obj.ResourceVersion)
	if err != nil || objRev > rev {
		return false, err
	}
	if g := b.groupOf(election); g != nil {
		if ok, err := g.holdBeacon(ctx, election, o.Holder.Lease, objRev, rev); !ok || err != nil {
			return false, err
		}
	}
	at := b.revs.mark()
	got, err := b.vacate(ctx, obj)
	if apierrors.IsConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, b.describe("update", err)
	}
	return true, b.revs.check(at, got.ResourceVersion)
}
