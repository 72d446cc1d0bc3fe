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
	return watchFrom(ctx, leases, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}, from)
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
