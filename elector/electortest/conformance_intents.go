package electortest

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// RunGroupIntents checks the rules of elector.IntentGrouper for a store that implements it
// (it skips the others): one watch of a group's intents reports each election's as its own
// watch would, and nothing of other elections.
func RunGroupIntents(t *testing.T, newHarness func(t *testing.T) Harness) {
	grouping := func(check func(t *testing.T, h *harness, ig elector.IntentGrouper, group string)) func(t *testing.T, h *harness) {
		return func(t *testing.T, h *harness) {
			ig, ok := h.NewClient(t).(elector.IntentGrouper)
			if !ok {
				t.Skip("the store does not watch a group's intents")
			}
			// A group of its own, named after an election no other subtest uses.
			check(t, h, ig, strings.ReplaceAll(h.election, ".", "-")+"-set")
		}
	}
	runSuite(t, newHarness, []suiteCase{
		{"group_intents_list_the_group_then_follow_it", grouping(groupIntentsFollowed)},
		{"group_intent_that_expires_is_reported_gone", grouping(groupIntentExpires)},
	})
}

// intentState applies a watch's reports to what it knows of the group's intents.
type intentState struct {
	h     *harness
	ch    <-chan elector.GroupIntents
	now   map[string]string
	first bool
}

func (h *harness) watchGroupIntents(ig elector.IntentGrouper, group string) *intentState {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	return &intentState{h: h, ch: ig.WatchGroupIntents(ctx, group), now: map[string]string{}}
}

// await applies reports until the intents are want, failing the test on a report of an
// election outside group, a first report without All, or want not reached in time.
func (s *intentState) await(group string, want map[string]string) {
	s.h.t.Helper()
	timeout := time.After(reportWithin)
	for !maps.Equal(s.now, want) {
		select {
		case rep, ok := <-s.ch:
			switch {
			case !ok:
				s.h.t.Fatalf("the watch of %s's intents closed; want %v, have %v", group, want, s.now)
			case rep.Err != nil:
				s.h.t.Fatalf("the watch of %s's intents broke: %v", group, rep.Err)
			case !s.first && !rep.All:
				s.h.t.Fatalf("the first report of %s's intents does not list them all: %+v", group, rep)
			}
			s.first = true
			if rep.All {
				s.now = map[string]string{}
			}
			for election, value := range rep.Intents {
				if !strings.HasPrefix(election, group+".") {
					s.h.t.Fatalf("the watch of %s's intents reported %s's", group, election)
				}
				if value == nil {
					delete(s.now, election)
				} else {
					s.now[election] = string(value)
				}
			}
		case <-timeout:
			s.h.t.Fatalf("the watch of %s's intents did not report %v within %s; it reported %v", group, want, reportWithin, s.now)
		}
	}
}

func groupIntentsFollowed(t *testing.T, h *harness, _ elector.IntentGrouper, group string) {
	writer := h.NewClient(t)
	set := func(election, value string) {
		t.Helper()
		if err := writer.SetIntent(h.ctx(), election, []byte(value), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	member := func(n int) string { return fmt.Sprintf("%s.%d", group, n) }
	set(member(1), "resign 1")
	set(member(2), "transfer 2")
	// Neither the set's own name nor another set whose name begins with it is the group.
	set(group, "not a shard")
	set(group+"x.1", "another set's")

	watcher := h.NewClient(t).(elector.IntentGrouper)
	w := h.watchGroupIntents(watcher, group)
	w.await(group, map[string]string{member(1): "resign 1", member(2): "transfer 2"})

	if err := writer.ClearIntent(h.ctx(), member(1), nil); err != nil {
		t.Fatal(err)
	}
	w.await(group, map[string]string{member(2): "transfer 2"})
	set(member(3), "transfer 3")
	set(group+"x.2", "another set's")
	w.await(group, map[string]string{member(2): "transfer 2", member(3): "transfer 3"})
	set(member(2), "resign 2")
	w.await(group, map[string]string{member(2): "resign 2", member(3): "transfer 3"})
}

func groupIntentExpires(t *testing.T, h *harness, ig elector.IntentGrouper, group string) {
	member := group + ".7"
	if err := h.NewClient(t).SetIntent(h.ctx(), member, []byte("short"), h.TTL); err != nil {
		t.Fatal(err)
	}
	w := h.watchGroupIntents(ig, group)
	w.await(group, map[string]string{member: "short"})
	h.Advance(2*h.TTL + time.Second)
	w.await(group, map[string]string{})
}
