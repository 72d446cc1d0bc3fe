package kubebackend

import (
	"fmt"
	"sync"

	"github.com/caddyleader/caddy-leader/elector"
)

// An API server whose etcd was restored from a snapshot without `etcdutl snapshot restore
// --bump-revision` answers with resourceVersions older than it gave before, and the
// election objects of the snapshot come back with their older tokens. The only signs are
// the revision of a consistent read or of a write (which, in one history, is at least
// every revision seen before the request was sent) and an election's token (which, in one
// history, only rises). Requests run concurrently, so each takes a mark when it starts and
// is compared with what was seen before it.

// revisions is what a Backend has seen of the store's history.
type revisions struct {
	mu      sync.Mutex
	highest int64
	epoch   uint64 // counts detected rewinds: answers to requests sent before one are not compared
	terms   map[string]termSeen
}

type termSeen struct{ token, at int64 }

// mark is the history as a request found it when it started.
type mark struct {
	highest int64
	epoch   uint64
}

func newRevisions() revisions { return revisions{terms: map[string]termSeen{}} }

func (r *revisions) mark() mark {
	r.mu.Lock()
	defer r.mu.Unlock()
	return mark{r.highest, r.epoch}
}

// check compares the revision of a consistent read or a write, rv, with the history the
// request started from.
func (r *revisions) check(at mark, rv string) error {
	v, err := parseRV(rv)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if at.epoch != r.epoch {
		return nil
	}
	if v < at.highest {
		r.rewound(v)
		return fmt.Errorf("kubernetes: resourceVersion %d after %d: %w", v, at.highest, elector.ErrStoreRewound)
	}
	r.highest = max(r.highest, v)
	return nil
}

// term compares the token of election's holder, read at revision rev, with the tokens
// seen before the request started.
func (r *revisions) term(at mark, election string, token, rev int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at.epoch != r.epoch {
		return nil
	}
	seen := r.terms[election]
	if token < seen.token && seen.at <= at.highest {
		r.rewound(rev)
		return fmt.Errorf("kubernetes: election %q has token %d after %d: %w", election, token, seen.token, elector.ErrStoreRewound)
	}
	if token > seen.token {
		r.terms[election] = termSeen{token, rev}
	}
	return nil
}

// rewound starts comparing with the new history.
func (r *revisions) rewound(rev int64) {
	r.highest = rev
	r.epoch++
	r.terms = map[string]termSeen{}
}
