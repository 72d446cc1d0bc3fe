package kubebackend

import (
	"context"
	"encoding/base64"
	"maps"
	"strings"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/elector"
)

// WatchGroupIntents implements elector.IntentGrouper with one watch of every intent object
// of this backend's (intents are few, and live only while a transfer or resign is asked),
// reporting those of the group's elections: a shard set's instances then watch their
// intents with one watch each, not one per shard, and list them once instead of once per
// shard. It selects by kind, not by group, so that the intents an instance of an older
// release writes (without a group label) are seen too; an object counts only under the
// name this backend gives its election's intent, which keeps out another prefix's.
func (b *Backend) WatchGroupIntents(ctx context.Context, group string) <-chan elector.GroupIntents {
	out := make(chan elector.GroupIntents, 1)
	b.startReaper()
	w := &groupIntentWatch{b: b, group: group, out: out}
	runWatch(ctx, b, out, func(err error) elector.GroupIntents { return elector.GroupIntents{Err: err} }, w.run)
	return out
}

// groupIntentWatch is one WatchGroupIntents.
type groupIntentWatch struct {
	b     *Backend
	group string
	out   chan<- elector.GroupIntents
	// intents is the group's intents as last reported, by election.
	intents map[string][]byte
}

func (w *groupIntentWatch) selector() metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy + "," + labelKind + "=" + kindIntent}
}

func (w *groupIntentWatch) run(ctx context.Context) error {
	return w.b.listThenWatch(ctx, w.selector(), w.relist, w.events)
}

// election is the group's election whose intent obj is, if it is one.
func (w *groupIntentWatch) election(obj *coordv1.Lease) (string, bool) {
	election := obj.Annotations[annElection]
	if !strings.HasPrefix(election, w.group+".") || obj.Name != w.b.intentName(election) {
		return "", false
	}
	return election, true
}

// relist reads the intents afresh, reports the whole list, and returns the revision to
// watch from.
func (w *groupIntentWatch) relist(ctx context.Context) (int64, error) {
	list, from, err := w.b.listSelected(ctx, w.selector())
	if err != nil {
		return 0, err
	}
	w.intents = map[string][]byte{}
	for i := range list.Items {
		obj := &list.Items[i]
		if election, ok := w.election(obj); ok {
			w.intents[election] = intentValue(obj)
		}
	}
	return from, w.send(ctx, elector.GroupIntents{All: true, Intents: maps.Clone(w.intents)})
}

// events handles one watch's events until it ends; it returns the revision to resume from.
func (w *groupIntentWatch) events(ctx context.Context, ch <-chan event, from int64) (int64, error) {
	for {
		var ev event
		var ok bool
		select {
		case <-ctx.Done():
			return from, ctx.Err()
		case ev, ok = <-ch:
		}
		if ended, next, err := w.b.watchEnded(ctx, ev, ok, from, w.relist); ended {
			return next, err
		}
		from = max(from, ev.rev)
		if ev.obj == nil {
			continue // a bookmark
		}
		election, ok := w.election(ev.obj)
		if !ok {
			continue
		}
		var value []byte
		if ev.deleted {
			delete(w.intents, election)
		} else {
			value = intentValue(ev.obj)
			if old, had := w.intents[election]; had && string(old) == string(value) {
				continue // rewritten with the same intent: its ttl starts again
			}
			w.intents[election] = value
		}
		if err := w.send(ctx, elector.GroupIntents{Intents: map[string][]byte{election: value}}); err != nil {
			return from, err
		}
	}
}

func (w *groupIntentWatch) send(ctx context.Context, rep elector.GroupIntents) error {
	select {
	case w.out <- rep:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// intentValue is the intent an intent object holds.
func intentValue(obj *coordv1.Lease) []byte {
	v, _ := base64.StdEncoding.DecodeString(obj.Annotations[annValue])
	return v
}

var _ elector.IntentGrouper = (*Backend)(nil)
