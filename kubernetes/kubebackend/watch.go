package kubebackend

import (
	"context"
	"strconv"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// event is one change a watch reports: an object written (obj) or deleted (deleted), a
// bookmark (only rev), or the watch's end (err).
type event struct {
	obj     *coordv1.Lease
	rev     int64
	deleted bool
	err     error
}

// watchNamed watches the object called name from revision from on.
func watchNamed(ctx context.Context, leases coordclient.LeaseInterface, name string, from int64) (<-chan event, func(), error) {
	return watchFrom(ctx, leases, namedOpts(name), from)
}

// runWatch runs watch in the background until it returns, or ctx ends, or the backend is
// closed; then it closes out, after sending broken(the error watch returned) unless ctx
// ended (or the backend was closed) first.
func runWatch[T any](ctx context.Context, b *Backend, out chan<- T, broken func(error) T, watch func(context.Context) error) {
	go func() {
		defer close(out)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(b.ctx, cancel)()
		if err := watch(ctx); err != nil && ctx.Err() == nil {
			select {
			case out <- broken(err):
			case <-ctx.Done():
			}
		}
	}()
}

// watchEnded tells an events loop whether the watch it follows ended with what it received
// (ok false: the channel closed), and then what the loop returns: the revision to resume
// from when the API server ended the watch, relist's when it no longer keeps that
// revision (410 Gone), or the error that broke the watch.
func (b *Backend) watchEnded(ctx context.Context, ev event, ok bool, from int64, relist func(context.Context) (int64, error)) (bool, int64, error) {
	switch {
	case !ok:
		return true, from, nil
	case ev.err == nil:
		return false, from, nil
	case apierrors.IsGone(ev.err) || apierrors.IsResourceExpired(ev.err):
		next, err := relist(ctx)
		return true, next, err
	}
	return true, from, b.describe("watch", ev.err)
}

// namedOpts selects the object called name.
func namedOpts(name string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
}

// watchOn watches the objects opts select from revision from on, one watch after another:
// events handles one watch's events until it ends and returns the revision to resume
// from, and relist reads the objects afresh when the API server no longer keeps that
// revision (410 Gone) and returns the revision to watch from then. It returns the first
// error (ctx's when it ends).
func (b *Backend) watchOn(ctx context.Context, leases coordclient.LeaseInterface, opts metav1.ListOptions, from int64,
	relist func(context.Context) (int64, error), events func(context.Context, <-chan event, int64) (int64, error)) error {
	for {
		ch, stop, err := watchFrom(ctx, leases, opts, from)
		if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
			if from, err = relist(ctx); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return b.describe("watch", err)
		}
		from, err = events(ctx, ch, from)
		stop()
		if err != nil {
			return err
		}
	}
}

// listThenWatch lists the objects opts select (relist, which returns the revision to
// watch from) and then watches them with watchOn.
func (b *Backend) listThenWatch(ctx context.Context, opts metav1.ListOptions,
	relist func(context.Context) (int64, error), events func(context.Context, <-chan event, int64) (int64, error)) error {
	leases, err := b.client()
	if err != nil {
		return err
	}
	from, err := relist(ctx)
	if err != nil {
		return err
	}
	return b.watchOn(ctx, leases, opts, from, relist, events)
}

// listSelected lists the objects opts select, with the rewind check, and returns them with
// the list's revision.
func (b *Backend) listSelected(ctx context.Context, opts metav1.ListOptions) (*coordv1.LeaseList, int64, error) {
	leases, err := b.client()
	if err != nil {
		return nil, 0, err
	}
	at := b.revs.mark()
	list, err := leases.List(ctx, opts)
	if err != nil {
		return nil, 0, b.describe("list", err)
	}
	if err := b.revs.check(at, list.ResourceVersion); err != nil {
		return nil, 0, err
	}
	from, err := parseRV(list.ResourceVersion)
	if err != nil {
		return nil, 0, err
	}
	return list, from, nil
}

// watchFrom watches the objects opts select from revision from on. The API server ends a
// watch after a while; the channel is then closed, and the caller resumes from the last
// revision it got. A revision it no longer keeps comes back as 410 Gone, in the returned
// error or in an event, and the caller lists again.
func watchFrom(ctx context.Context, leases coordclient.LeaseInterface, opts metav1.ListOptions, from int64) (<-chan event, func(), error) {
	opts.ResourceVersion = strconv.FormatInt(from, 10)
	opts.AllowWatchBookmarks = true
	w, err := leases.Watch(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	out := make(chan event)
	done := make(chan struct{})
	go func() {
		defer close(out)
		for ev := range w.ResultChan() {
			var e event
			switch ev.Type {
			case watch.Error:
				e.err = apierrors.FromObject(ev.Object)
			default:
				obj, ok := ev.Object.(*coordv1.Lease)
				if !ok {
					continue
				}
				e.rev, e.err = parseRV(obj.ResourceVersion)
				if ev.Type != watch.Bookmark {
					e.obj, e.deleted = obj, ev.Type == watch.Deleted
				}
			}
			select {
			case out <- e:
			case <-done:
				return
			}
			if e.err != nil {
				return
			}
		}
	}()
	return out, func() { close(done); w.Stop() }, nil
}
