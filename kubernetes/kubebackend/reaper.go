package kubebackend

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The reaper is how objects expire here. Every backend that campaigns or watches follows
// the objects that expire (leases, acknowledgements, intents) with one watch of the
// namespace, notes when it first saw each resourceVersion, and deletes an object whose
// resourceVersion it has seen unchanged for the object's leaseDurationSeconds, on
// condition that it still is that version. Several backends may try; one succeeds. A lease
// it deleted has its keys cleared (unbind).

// scanEvery is how often the reaper looks for objects due.
const scanEvery = 100 * time.Millisecond

type tracked struct {
	obj    *coordv1.Lease
	seen   time.Time // when this resourceVersion was first seen, by the monotonic clock
	ttl    time.Duration
	reaped bool // a delete of this version is under way or was refused
}

type reaper struct {
	b *Backend

	mu      sync.Mutex
	objs    map[string]*tracked
	waiters map[string][]chan struct{}
	// following is set while objs is a listed view that the watch keeps current, and
	// cleared while the reaper lists again.
	following bool
}

// shows reports whether the reaper's current view has the object called name, not
// being deleted.
func (r *reaper) shows(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.objs[name]
	return r.following && ok && !t.reaped
}

// follows notes whether the watch keeps the view current.
func (r *reaper) follows(on bool) {
	r.mu.Lock()
	r.following = on
	r.mu.Unlock()
}

// startReaper starts the backend's reaper if it is not running yet.
func (b *Backend) startReaper() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reaper != nil || b.closed {
		return
	}
	b.reaper = &reaper{b: b, objs: map[string]*tracked{}, waiters: map[string][]chan struct{}{}}
	b.wg.Go(func() { b.reaper.run(b.ctx) })
}

// gone returns a channel that is closed once the object called name is known not to exist.
func (r *reaper) gone(ctx context.Context, name string) <-chan struct{} {
	ch := make(chan struct{})
	r.mu.Lock()
	r.waiters[name] = append(r.waiters[name], ch)
	_, known := r.objs[name]
	r.mu.Unlock()
	if !known {
		// Not (yet) in the watch's view: the object may be newer than it. Ask.
		r.b.wg.Go(func() {
			leases, err := r.b.client()
			if err != nil {
				return
			}
			obj, err := leases.Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				r.forget(name)
			case err == nil:
				r.seen(obj)
			}
		})
	}
	return ch
}

// seen notes obj's current version.
func (r *reaper) seen(obj *coordv1.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.objs[obj.Name]
	if ok && t.obj.ResourceVersion == obj.ResourceVersion {
		return
	}
	if ok && olderRV(obj.ResourceVersion, t.obj.ResourceVersion) {
		return // a late answer to a get
	}
	r.objs[obj.Name] = &tracked{obj: obj, seen: time.Now(), ttl: time.Duration(*seconds32(obj.Spec.LeaseDurationSeconds)) * time.Second}
}

func olderRV(a, b string) bool {
	x, err1 := parseRV(a)
	y, err2 := parseRV(b)
	return err1 == nil && err2 == nil && x < y
}

// forget notes that the object called name is gone, and tells whoever waits for that.
func (r *reaper) forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.objs, name)
	for _, ch := range r.waiters[name] {
		close(ch)
	}
	delete(r.waiters, name)
}

func (r *reaper) run(ctx context.Context) {
	leases, err := r.b.client()
	if err != nil {
		return
	}
	sel := metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy + "," + labelExpires + "=true"}
	tick := time.NewTicker(scanEvery)
	defer tick.Stop()
	for ctx.Err() == nil {
		list, err := leases.List(ctx, sel)
		if err != nil {
			r.b.cfg.Logger.Debug("listing leases to expire", zap.Error(err))
			sleep(ctx, time.Second)
			continue
		}
		from, _ := parseRV(list.ResourceVersion)
		r.sync(list.Items, from)
		r.follows(true)
		for ctx.Err() == nil {
			ch, stop, err := watchFrom(ctx, leases, sel, from)
			if err != nil {
				break // list again
			}
			var broke bool
			from, broke = r.follow(ctx, ch, tick.C, from)
			stop()
			if broke {
				break
			}
		}
		r.follows(false)
	}
}

// follow applies one watch's events until it ends; broke says it must list again.
func (r *reaper) follow(ctx context.Context, ch <-chan event, tick <-chan time.Time, from int64) (int64, bool) {
	for {
		select {
		case <-ctx.Done():
			return from, true
		case <-tick:
			r.reap(ctx)
		case ev, ok := <-ch:
			switch {
			case !ok:
				return from, false
			case ev.err != nil:
				return from, true
			}
			from = max(from, ev.rev)
			switch {
			case ev.obj == nil:
			case ev.deleted:
				r.forget(ev.obj.Name)
			default:
				r.seen(ev.obj)
			}
		}
	}
}

// sync replaces the view with a fresh list taken at revision rev: an object seen before
// that is not in it was deleted.
func (r *reaper) sync(items []coordv1.Lease, rev int64) {
	names := map[string]bool{}
	for i := range items {
		names[items[i].Name] = true
		r.seen(&items[i])
	}
	r.mu.Lock()
	var gone []string
	for name, t := range r.objs {
		if v, err := parseRV(t.obj.ResourceVersion); !names[name] && err == nil && v <= rev {
			gone = append(gone, name)
		}
	}
	r.mu.Unlock()
	for _, name := range gone {
		r.forget(name)
	}
}

// reap deletes the objects due.
func (r *reaper) reap(ctx context.Context) {
	r.mu.Lock()
	var due []*coordv1.Lease
	for _, t := range r.objs {
		if !t.reaped && time.Since(t.seen) >= t.ttl {
			t.reaped = true
			due = append(due, t.obj)
		}
	}
	r.mu.Unlock()
	for _, obj := range due {
		err := r.b.deleteAt(ctx, obj)
		switch {
		case err == nil:
			r.forget(obj.Name)
			if id, ok := r.b.leaseID(obj.Name); ok {
				if err := r.b.unbind(ctx, id); err != nil {
					r.b.cfg.Logger.Debug("clearing the keys of an expired lease", zap.String("lease", obj.Name), zap.Error(err))
				}
			}
		case apierrors.IsNotFound(err):
			r.forget(obj.Name)
		case apierrors.IsConflict(err):
			// Renewed in time: the watch brings the new version.
		default:
			r.b.cfg.Logger.Debug("deleting an expired lease", zap.String("lease", obj.Name), zap.Error(err))
			r.mu.Lock()
			if t, ok := r.objs[obj.Name]; ok && t.obj == obj {
				t.reaped = false // try again at the next scan
			}
			r.mu.Unlock()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
