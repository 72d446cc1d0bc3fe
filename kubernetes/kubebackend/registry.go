package kubebackend

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/elector"
)

// Announcements, the history and intents are Lease objects too, so that one Role on
// leases covers everything the store does.

// put creates obj, or replaces the object of its name through change, retrying when
// another writer gets in between.
func (b *Backend) put(ctx context.Context, obj *coordv1.Lease, change func(cur *coordv1.Lease) *coordv1.Lease) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	for {
		cur, err := leases.Get(ctx, obj.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, change(obj.DeepCopy()), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			return b.describe("create", err)
		case err != nil:
			return b.describe("get", err)
		}
		_, err = leases.Update(ctx, change(cur.DeepCopy()), metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		return b.describe("update", err)
	}
}

// Announce implements elector.Backend.
func (b *Backend) Announce(ctx context.Context, election, id string, value []byte, lease elector.LeaseID) error {
	ok, err := b.alive(ctx, lease)
	if err != nil {
		return err
	}
	if !ok {
		return elector.ErrLeaseNotFound
	}
	holder := b.leaseName(lease)
	obj := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: b.candidateName(election, id), Labels: labels(kindCandidate, election, false)}}
	return b.put(ctx, obj, func(cur *coordv1.Lease) *coordv1.Lease {
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		cur.Labels[labelLease] = leaseHex(lease)
		cur.Annotations = map[string]string{annElection: election, annID: id, annValue: base64.StdEncoding.EncodeToString(value)}
		cur.Spec.HolderIdentity = &holder
		return cur
	})
}

// Candidates implements elector.Backend: the announcements whose lease object exists.
func (b *Backend) Candidates(ctx context.Context, election string) ([]elector.CandidateEntry, error) {
	leases, err := b.client()
	if err != nil {
		return nil, err
	}
	sel := func(kind string) metav1.ListOptions {
		return metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy + "," + labelKind + "=" + kind}
	}
	cands, err := leases.List(ctx, metav1.ListOptions{LabelSelector: sel(kindCandidate).LabelSelector + "," + labelElection + "=" + hash(election)})
	if err != nil {
		return nil, b.describe("list", err)
	}
	// Listed after the announcements, so that a lease granted in between is not missed.
	alive, err := b.liveLeases(ctx)
	if err != nil {
		return nil, err
	}
	var out []elector.CandidateEntry
	for i := range cands.Items {
		if en, ok := b.candidateEntry(&cands.Items[i], election, func(holder string) bool { return alive[holder] }); ok {
			out = append(out, en)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// liveLeases lists the names of the lease objects that exist.
func (b *Backend) liveLeases(ctx context.Context) (map[string]bool, error) {
	leases, err := b.client()
	if err != nil {
		return nil, err
	}
	live, err := leases.List(ctx, metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy + "," + labelKind + "=" + kindLease})
	if err != nil {
		return nil, b.describe("list", err)
	}
	alive := map[string]bool{}
	for _, l := range live.Items {
		alive[l.Name] = true
	}
	return alive, nil
}

// AppendHistory implements elector.Backend: a read-modify-write of the history object,
// conditional on its resourceVersion.
func (b *Backend) AppendHistory(ctx context.Context, election string, entry []byte, keep int) error {
	obj := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: b.historyName(election), Labels: labels(kindHistory, election, false),
		Annotations: map[string]string{annElection: election}}}
	var bad error
	err := b.put(ctx, obj, func(cur *coordv1.Lease) *coordv1.Lease {
		entries, err := decodeHistory(cur)
		if err != nil {
			bad = err
			entries = nil // an unreadable history is started again rather than kept broken
		}
		entries = append(entries, entry)
		if keep > 0 && len(entries) > keep {
			entries = entries[len(entries)-keep:]
		}
		data, _ := json.Marshal(entries)
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[annHistory] = string(data)
		return cur
	})
	if err == nil && bad != nil {
		b.cfg.Logger.Sugar().Warnf("kubernetes: election %q: the history could not be read and was started again: %v", election, bad)
	}
	return err
}

func decodeHistory(obj *coordv1.Lease) ([][]byte, error) {
	data := obj.Annotations[annHistory]
	if data == "" {
		return nil, nil
	}
	var entries [][]byte
	if err := json.Unmarshal([]byte(data), &entries); err != nil {
		return nil, fmt.Errorf("annotation %s of %s: %w", annHistory, obj.Name, err)
	}
	return entries, nil
}

// History implements elector.Backend.
func (b *Backend) History(ctx context.Context, election string) ([][]byte, error) {
	leases, err := b.client()
	if err != nil {
		return nil, err
	}
	obj, err := leases.Get(ctx, b.historyName(election), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, b.describe("get", err)
	}
	return decodeHistory(obj)
}

// SetIntent implements elector.Backend. Every write gives the object a new
// resourceVersion, so the reapers start its ttl again.
func (b *Backend) SetIntent(ctx context.Context, election string, value []byte, ttl time.Duration) error {
	secs := seconds(ttl)
	obj := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: b.intentName(election), Labels: labels(kindIntent, election, true)}}
	return b.put(ctx, obj, func(cur *coordv1.Lease) *coordv1.Lease {
		now := metav1.NowMicro()
		cur.Annotations = map[string]string{annElection: election, annValue: base64.StdEncoding.EncodeToString(value)}
		cur.Spec.LeaseDurationSeconds, cur.Spec.RenewTime = &secs, &now
		return cur
	})
}

// CreateIntent implements elector.IntentCreator: the object is created only where none
// is (the reaper deletes an intent whose time is up).
func (b *Backend) CreateIntent(ctx context.Context, election string, value []byte, ttl time.Duration) (bool, error) {
	leases, err := b.client()
	if err != nil {
		return false, err
	}
	secs, now := seconds(ttl), metav1.NowMicro()
	obj := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: b.intentName(election), Labels: labels(kindIntent, election, true),
			Annotations: map[string]string{annElection: election, annValue: base64.StdEncoding.EncodeToString(value)},
		},
		Spec: coordv1.LeaseSpec{LeaseDurationSeconds: &secs, RenewTime: &now},
	}
	_, err = leases.Create(ctx, obj, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return false, nil
	case err != nil:
		return false, b.describe("create", err)
	}
	return true, nil
}

var _ elector.IntentCreator = (*Backend)(nil)

// ClearIntent implements elector.Backend: the delete is conditional on the
// resourceVersion read, so an intent written since stays.
func (b *Backend) ClearIntent(ctx context.Context, election string, value []byte) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	opts := metav1.DeleteOptions{}
	if value != nil {
		obj, err := leases.Get(ctx, b.intentName(election), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return b.describe("get", err)
		}
		if v, _ := base64.StdEncoding.DecodeString(obj.Annotations[annValue]); !bytes.Equal(v, value) {
			return nil // another intent now
		}
		rv := obj.ResourceVersion
		opts.Preconditions = &metav1.Preconditions{ResourceVersion: &rv}
	}
	err = leases.Delete(ctx, b.intentName(election), opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return b.describe("delete", err)
	}
	return nil
}

// WatchIntent implements elector.Backend.
func (b *Backend) WatchIntent(ctx context.Context, election string) <-chan elector.IntentChange {
	out := make(chan elector.IntentChange, 1)
	b.startReaper()
	runWatch(ctx, b, out, func(err error) elector.IntentChange { return elector.IntentChange{Err: err} },
		func(ctx context.Context) error { return b.watchIntent(ctx, election, out) })
	return out
}

func (b *Backend) watchIntent(ctx context.Context, election string, out chan<- elector.IntentChange) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	name := b.intentName(election)
	reported, lastPresent, lastValue := false, false, ""
	report := func(obj *coordv1.Lease) error {
		var v []byte
		if obj != nil {
			v = intentValue(obj)
		}
		if reported && lastPresent == (obj != nil) && lastValue == string(v) {
			return nil
		}
		reported, lastPresent, lastValue = true, obj != nil, string(v)
		select {
		case out <- elector.IntentChange{Value: v}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		obj, from, err := b.getNamed(ctx, b.revs.mark(), name)
		if err != nil {
			return err
		}
		if err := report(obj); err != nil {
			return err
		}
		for relist := false; !relist; {
			ch, stop, err := watchNamed(ctx, leases, name, from)
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				break
			}
			if err != nil {
				return b.describe("watch", err)
			}
			for ev := range ch {
				if ev.err != nil {
					if !apierrors.IsGone(ev.err) && !apierrors.IsResourceExpired(ev.err) {
						stop()
						return b.describe("watch", ev.err)
					}
					relist = true
					break
				}
				from = max(from, ev.rev)
				switch {
				case ev.obj == nil:
				case ev.deleted:
					err = report(nil)
				default:
					err = report(ev.obj)
				}
				if err != nil {
					stop()
					return err
				}
			}
			stop()
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
}
