package electortest_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

func TestAnErrandIsDoneByTheLeaderOnce(t *testing.T) {
	t.Parallel()
	f, _ := fakeFleet(t, 3)
	leader, _ := f.Leader(3 * ttl)
	type done struct {
		by, from, errand string
	}
	var mu sync.Mutex
	var got []done
	release := make(chan struct{})
	for _, m := range f.Members {
		m := m
		m.Election.HandleErrands(func(_ context.Context, from string, errand []byte) {
			mu.Lock()
			got = append(got, done{m.ID, from, string(errand)})
			mu.Unlock()
			<-release
		})
	}
	var asker *elector.Election
	for _, m := range f.Members {
		if m != leader {
			asker = m.Election
			break
		}
	}
	if err := asker.AskLeader(context.Background(), []byte(`{"job":"sweep"}`)); err != nil {
		t.Fatal(err)
	}
	f.Await("the errand under way", 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1
	})
	f.Await("the asker seeing it pending", 5*time.Second, asker.RequestPending)
	if err := asker.AskLeader(context.Background(), []byte(`{"job":"other"}`)); !errors.Is(err, elector.ErrIntentPending) {
		t.Errorf("a second errand while the first is pending: %v, want ErrIntentPending", err)
	}
	close(release)
	f.Await("the errand cleared", 5*time.Second, func() bool { return !asker.RequestPending() })
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].by != leader.ID || got[0].errand != `{"job":"sweep"}` {
		t.Errorf("errands done: %+v; want one, by the leader %s", got, leader.ID)
	}
	for _, m := range f.Members {
		if m.ID == got[0].from && m.Election != asker {
			t.Errorf("the errand says it came from %s, not the asker", got[0].from)
		}
	}
}

func TestAnErrandMustBeJSON(t *testing.T) {
	t.Parallel()
	f, _ := fakeFleet(t, 1)
	f.Leader(3 * ttl)
	if err := f.Members[0].Election.AskLeader(context.Background(), []byte(`not json`)); err == nil {
		t.Error("an errand that is not JSON was stored")
	}
}
