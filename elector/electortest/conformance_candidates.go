package electortest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// The candidate registry's watch (elector.Backend.WatchCandidates). Every change below is
// awaited before the next is made, so a store that coalesces quick changes still reports
// each of them; a report equal to the one before it is allowed, any other state is not.

// render writes a list as "id=value id=value", in the order given.
func render(entries []elector.CandidateEntry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.ID + "=" + string(e.Value)
	}
	return strings.Join(parts, " ")
}

func (h *harness) watchCandidates(b elector.Backend) <-chan elector.CandidatesChange {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	return b.WatchCandidates(ctx, h.election)
}

// nextList waits for the watch's next report, checks that it is sorted by id with one
// entry per id, and returns it rendered.
func (h *harness) nextList(ch <-chan elector.CandidatesChange, within time.Duration) string {
	h.t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			h.t.Fatal("candidates watch closed")
		}
		if c.Err != nil {
			h.t.Fatalf("candidates watch broke: %v", c.Err)
		}
		for i := 1; i < len(c.Candidates); i++ {
			if c.Candidates[i-1].ID >= c.Candidates[i].ID {
				h.t.Fatalf("candidates watch reports %q: not sorted by id, or an id twice", render(c.Candidates))
			}
		}
		return render(c.Candidates)
	case <-time.After(within):
		h.t.Fatalf("candidates watch reported nothing within %s", within)
	}
	return ""
}

// awaitList reads reports until one is want; a report equal to was (the state before the
// change awaited) may come first, any other fails the test.
func (h *harness) awaitList(ch <-chan elector.CandidatesChange, was, want string, within time.Duration) {
	h.t.Helper()
	for {
		switch got := h.nextList(ch, within); got {
		case want:
			return
		case was:
		default:
			h.t.Fatalf("candidates watch reports %q, want %q (or %q again)", got, want, was)
		}
	}
}

func (h *harness) announce(b elector.Backend, id, value string, lease elector.LeaseID) {
	h.t.Helper()
	if err := b.Announce(h.ctx(), h.election, id, []byte(value), lease); err != nil {
		h.t.Fatalf("Announce %s=%s: %v", id, value, err)
	}
}

// candidatesWatch: the first report is the list as it is; then every announcement, new
// value and revoke is reported, each report the whole list.
func candidatesWatch(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	b, lb, _ := h.client()
	h.keepAlive(a, la, ttl)
	h.keepAlive(b, lb, ttl)
	h.announce(a, "beta", "beta-1", la)
	changes := h.watchCandidates(b)
	if got := h.nextList(changes, reportWithin); got != "beta=beta-1" {
		t.Fatalf("the watch's first report is %q, want the list as it is: beta=beta-1", got)
	}
	steps := []struct {
		what string
		do   func()
		want string
	}{
		{"alpha announced", func() { h.announce(b, "alpha", "alpha-1", lb) }, "alpha=alpha-1 beta=beta-1"},
		{"beta announced again with a new value", func() { h.announce(a, "beta", "beta-2", la) }, "alpha=alpha-1 beta=beta-2"},
		{"alpha's lease revoked", func() {
			if err := b.Revoke(h.ctx(), lb); err != nil {
				t.Fatal(err)
			}
		}, "beta=beta-2"},
		{"gamma announced", func() { h.announce(a, "gamma", "gamma-1", la) }, "beta=beta-2 gamma=gamma-1"},
	}
	was := "beta=beta-1"
	for _, s := range steps {
		s.do()
		h.awaitList(changes, was, s.want, reportWithin)
		was = s.want
	}
	// A watch started now begins with the same list.
	if got := h.nextList(h.watchCandidates(a), reportWithin); got != was {
		t.Fatalf("a new watch's first report is %q, want %q", got, was)
	}
}

// candidatesWatchExpiry: a candidate whose lease runs out unrenewed leaves the list, as
// Candidates would no longer list it.
func candidatesWatchExpiry(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	h.keepAlive(a, la, ttl)
	h.announce(a, "alpha", "alpha-1", la)
	b, lb, _ := h.client()
	h.announce(b, "beta", "beta-1", lb)
	changes := h.watchCandidates(a)
	if got := h.nextList(changes, reportWithin); got != "alpha=alpha-1 beta=beta-1" {
		t.Fatalf("the watch's first report is %q, want alpha=alpha-1 beta=beta-1", got)
	}
	// alpha's lease is renewed halfway (on a store whose time jumps too), beta's is not.
	h.Advance(ttl / 2)
	if _, err := a.Renew(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	h.Advance(ttl/2 + ttl/4)
	h.awaitList(changes, "alpha=alpha-1 beta=beta-1", "alpha=alpha-1", reportWithin+2*ttl)
}

// candidatesWatchOrder: announcements made one after the other are reported in that
// order: no report shows a state the store never had, or one older than a state reported
// before it, and the last state is reported.
func candidatesWatchOrder(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	h.keepAlive(a, la, ttl)
	changes := h.watchCandidates(a)
	if got := h.nextList(changes, reportWithin); got != "" {
		t.Fatalf("the watch's first report is %q, want an empty list", got)
	}
	const rounds = 10
	// alpha and beta take turns: after alpha's k-th value, beta has its (k-1)-th or k-th.
	announced := make(chan struct{})
	defer func() { <-announced }() // the last report may come before the last answer
	go func() {
		defer close(announced)
		for k := 1; k <= rounds; k++ {
			for _, id := range []string{"alpha", "beta"} {
				if err := a.Announce(h.ctx(), h.election, id, fmt.Appendf(nil, "%02d", k), la); err != nil {
					t.Errorf("Announce %s %d: %v", id, k, err)
					return
				}
			}
		}
	}()
	last := 0 // how many announcements the last report reflects
	for last < 2*rounds {
		got := h.nextList(changes, reportWithin)
		values := map[string]int{}
		for _, f := range strings.Fields(got) {
			id, v, _ := strings.Cut(f, "=")
			k, err := strconv.Atoi(v)
			if err != nil || id != "alpha" && id != "beta" {
				t.Fatalf("candidates watch reports %q, a state the store never had", got)
			}
			values[id] = k
		}
		alpha, beta := values["alpha"], values["beta"]
		if beta != alpha && beta != alpha-1 {
			t.Fatalf("candidates watch reports %q, a state the store never had", got)
		}
		if alpha+beta < last {
			t.Fatalf("candidates watch reports %q after a later state (%d announcements in)", got, last)
		}
		last = alpha + beta
	}
}

// candidatesWatchEnds: a watch ends, its channel closed, when its context does (with no
// error) and when its client is closed (with an error at most, reported last).
func candidatesWatchEnds(t *testing.T, h *harness) {
	a, la, ttl := h.client()
	h.keepAlive(a, la, ttl)
	h.announce(a, "alpha", "alpha-1", la)
	ctx, cancel := context.WithCancel(context.Background())
	changes := a.WatchCandidates(ctx, h.election)
	if got := h.nextList(changes, reportWithin); got != "alpha=alpha-1" {
		t.Fatalf("the watch's first report is %q, want alpha=alpha-1", got)
	}
	cancel()
	drain := func(ch <-chan elector.CandidatesChange, what string, errAllowed bool) {
		t.Helper()
		timeout := time.After(reportWithin)
		for broke := false; ; {
			select {
			case c, ok := <-ch:
				switch {
				case !ok:
					return
				case broke:
					t.Fatalf("after %s the watch reported %q after its error", what, render(c.Candidates))
				case c.Err != nil && !errAllowed:
					t.Fatalf("after %s the watch reported an error: %v", what, c.Err)
				}
				broke = c.Err != nil
			case <-timeout:
				t.Fatalf("after %s the watch was not closed within %s", what, reportWithin)
			}
		}
	}
	drain(changes, "its context ended", false)

	b := h.NewClient(t)
	changes = h.watchCandidates(b)
	if got := h.nextList(changes, reportWithin); got != "alpha=alpha-1" {
		t.Fatalf("the watch's first report is %q, want alpha=alpha-1", got)
	}
	b.Close()
	drain(changes, "its client was closed", true)
}
