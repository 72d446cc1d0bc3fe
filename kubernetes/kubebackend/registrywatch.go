package kubebackend

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/caddyleader/caddy-leader/elector"
)

// WatchCandidates implements elector.Backend with a watch of the election's announcement
// objects, resumed from its last resourceVersion when the API server ends it and listed
// afresh on 410 Gone. An announcement counts only while its lease object exists, as in
// Candidates: each one's lease is followed through the reaper (reaper.go), and one whose
// lease object goes leaves the list at once, before the revoker or the reaper deletes the
// announcement itself. A lease's end comes from the reaper's watch, not this one, so it
// may be reported before an announcement the store wrote just before it; announcements
// come in the store's order.
func (b *Backend) WatchCandidates(ctx context.Context, election string) <-chan elector.CandidatesChange {
	out := make(chan elector.CandidatesChange, 1)
	b.startReaper()
	w := &registryWatch{b: b, election: election, out: out, died: make(chan string),
		followed: map[string]bool{}, dead: map[string]bool{}}
	runWatch(ctx, b, out, func(err error) elector.CandidatesChange { return elector.CandidatesChange{Err: err} }, w.run)
	return out
}

// registryWatch is one WatchCandidates.
type registryWatch struct {
	b        *Backend
	election string
	out      chan<- elector.CandidatesChange
	objs     map[string]*coordv1.Lease // the election's announcements, by object name
	reported []elector.CandidateEntry  // nil until the first report
	// died receives the name of each followed lease object once it is gone; followed
	// and dead are the lease objects followed so far and those known gone.
	died     chan string
	followed map[string]bool
	dead     map[string]bool
}

func (w *registryWatch) selector() metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: labelManagedBy + "=" + managedBy + "," + labelKind + "=" + kindCandidate +
		"," + labelElection + "=" + hash(w.election)}
}

func (w *registryWatch) run(ctx context.Context) error {
	return w.b.listThenWatch(ctx, w.selector(), w.relist, w.events)
}

// relist reads the announcements, and then the lease objects alive (so that a lease
// granted in between is not missed), reports the list, and returns the revision to watch
// from.
func (w *registryWatch) relist(ctx context.Context) (int64, error) {
	list, from, err := w.b.listSelected(ctx, w.selector())
	if err != nil {
		return 0, err
	}
	alive, err := w.b.liveLeases(ctx)
	if err != nil {
		return 0, err
	}
	w.objs = map[string]*coordv1.Lease{}
	for i := range list.Items {
		obj := &list.Items[i]
		if h := obj.Spec.HolderIdentity; h != nil && !alive[*h] {
			w.dead[*h] = true
		}
		w.note(ctx, obj)
	}
	return from, w.report(ctx)
}

// note keeps obj as the newest version of its announcement, and follows its lease.
func (w *registryWatch) note(ctx context.Context, obj *coordv1.Lease) {
	w.objs[obj.Name] = obj
	h := obj.Spec.HolderIdentity
	if h == nil || w.followed[*h] || w.dead[*h] {
		return
	}
	w.followed[*h] = true
	gone := w.b.reaper.gone(ctx, *h)
	go func() {
		select {
		case <-gone:
			select {
			case w.died <- *h:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
}

// events handles one watch's events until it ends; it returns the revision to resume from.
func (w *registryWatch) events(ctx context.Context, ch <-chan event, from int64) (int64, error) {
	for {
		select {
		case <-ctx.Done():
			return from, ctx.Err()
		case name := <-w.died:
			w.dead[name] = true
		case ev, ok := <-ch:
			if ended, next, err := w.b.watchEnded(ctx, ev, ok, from, w.relist); ended {
				return next, err
			}
			from = max(from, ev.rev)
			switch {
			case ev.obj == nil:
				continue // a bookmark
			case ev.deleted:
				delete(w.objs, ev.obj.Name)
			default:
				w.note(ctx, ev.obj)
			}
		}
		if err := w.report(ctx); err != nil {
			return from, err
		}
	}
}

// report sends the list as the view has it now, unless it is the one reported last.
func (w *registryWatch) report(ctx context.Context) error {
	list := []elector.CandidateEntry{}
	for _, obj := range w.objs {
		if en, ok := w.b.candidateEntry(obj, w.election, func(holder string) bool { return !w.dead[holder] }); ok {
			list = append(list, en)
		}
	}
	slices.SortFunc(list, func(x, y elector.CandidateEntry) int { return strings.Compare(x.ID, y.ID) })
	if w.reported != nil && slices.EqualFunc(list, w.reported, sameEntry) {
		return nil
	}
	select {
	case w.out <- elector.CandidatesChange{Candidates: list}:
		w.reported = list
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sameEntry(x, y elector.CandidateEntry) bool {
	return x.ID == y.ID && string(x.Value) == string(y.Value)
}

// candidateEntry is the registry entry announcement obj makes in election, if its lease
// is alive.
func (b *Backend) candidateEntry(obj *coordv1.Lease, election string, alive func(holder string) bool) (elector.CandidateEntry, bool) {
	if obj.Spec.HolderIdentity == nil || !alive(*obj.Spec.HolderIdentity) || obj.Annotations[annElection] != election {
		return elector.CandidateEntry{}, false
	}
	value, _ := base64.StdEncoding.DecodeString(obj.Annotations[annValue])
	return elector.CandidateEntry{ID: obj.Annotations[annID], Value: value}, true
}
