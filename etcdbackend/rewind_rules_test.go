package etcdbackend

import (
	"errors"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddyleader/caddy-leader/elector"
)

// TestRewindRules checks which answers count as the store going back, on answers as etcd
// shapes them; the real restore is TestRestoredEtcd's. Each step sends a request (takes a
// mark) or answers one sent earlier, and says whether the answer must be a rewind.
func TestRewindRules(t *testing.T) {
	type step struct {
		send   string // name a request being sent now
		answer string // the request this answer is to
		rev    int64  // its header revision
		// token, if not zero, makes the answer an election key held in this term.
		token  int64
		rewind bool
	}
	tests := []struct {
		name  string
		steps []step
		// logs is how many ERROR lines the steps must log in all.
		logs int
	}{
		{
			name: "rising_revisions_are_fine",
			steps: []step{
				{send: "a"}, {answer: "a", rev: 5},
				{send: "b"}, {answer: "b", rev: 9},
			},
		},
		{
			name: "an_answer_overtaken_by_a_later_request_is_not_a_rewind",
			steps: []step{
				{send: "a"}, {answer: "a", rev: 5},
				{send: "grant"}, {send: "put"},
				{answer: "put", rev: 9}, {answer: "grant", rev: 7},
			},
		},
		{
			name: "below_what_was_known_when_sent_is_a_rewind_logged_once",
			steps: []step{
				{send: "a"}, {answer: "a", rev: 100},
				{send: "b"}, {send: "c"},
				{answer: "b", rev: 20, rewind: true},
				{answer: "c", rev: 18},              // sent before the rewind was seen: of either history
				{send: "d"}, {answer: "d", rev: 21}, // rebased: the new history goes on
			},
			logs: 1,
		},
		{
			name: "the_snapshot_term_coming_back_at_a_later_revision_is_a_rewind",
			steps: []step{
				{send: "a"}, {answer: "a", rev: 100, token: 90},
				{send: "b"}, {answer: "b", rev: 1_000_000_050, token: 40, rewind: true},
				{send: "c"}, {answer: "c", rev: 1_000_000_051, token: 40, rewind: true}, // still stale, not logged again
				{send: "d"}, {answer: "d", rev: 1_000_000_060, token: 1_000_000_055},
			},
			logs: 1,
		},
		{
			name: "an_old_history_term_answered_after_the_rewind_is_not_remembered",
			steps: []step{
				{send: "a"}, {answer: "a", rev: 100, token: 90},
				{send: "old"}, {send: "b"},
				{answer: "b", rev: 20, rewind: true},
				{answer: "old", rev: 101, token: 95},
				{send: "c"}, {answer: "c", rev: 120, token: 30},
			},
			logs: 1,
		},
		{
			name: "an_older_term_read_at_an_older_revision_is_not_a_rewind",
			steps: []step{
				{send: "read"}, {send: "watch"},
				{answer: "watch", rev: 60, token: 55},
				{answer: "read", rev: 50, token: 40},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.ErrorLevel)
			b, err := New(Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.New(core)})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			marks := map[string]mark{}
			for i, s := range tt.steps {
				if s.send != "" {
					marks[s.send] = b.mark()
					continue
				}
				err := b.checked(marks[s.answer], &pb.ResponseHeader{Revision: s.rev})
				if err == nil && s.token != 0 {
					err = b.checkTerm(marks[s.answer], "e", s.rev, &elector.Holder{Token: s.token})
				}
				if got := errors.Is(err, elector.ErrStoreRewound); got != s.rewind {
					t.Fatalf("step %d (answer to %s at %d): rewind = %v (%v), want %v", i, s.answer, s.rev, got, err, s.rewind)
				}
			}
			if n := logs.Len(); n != tt.logs {
				t.Errorf("%d ERROR lines, want %d: %v", n, tt.logs, logs.All())
			}
		})
	}
}

// TestRewindReachesRenewAndWatches checks that a rewind detected by any request is owed to
// the next Renew, once, unless a lease was granted since, and ends the watches open then.
func TestRewindReachesRenewAndWatches(t *testing.T) {
	b, err := New(Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := b.mark()
	_ = b.checked(m, &pb.ResponseHeader{Revision: 100})
	open, ahead := b.watchRewound(100)
	if ahead {
		t.Fatal("revision 100, just seen, counts as ahead")
	}
	m = b.mark()
	if err := b.checked(m, &pb.ResponseHeader{Revision: 10}); !errors.Is(err, elector.ErrStoreRewound) {
		t.Fatalf("answer at 10 after 100: %v, want a rewind", err)
	}
	select {
	case <-open:
	default:
		t.Error("a watch open at the rewind was not told")
	}
	if _, ahead := b.watchRewound(100); !ahead {
		t.Error("a watch from revision 100 of the old history does not call for a check")
	}
	if !b.takeRenewOwed() || b.takeRenewOwed() {
		t.Error("the rewind is not owed to exactly one Renew")
	}
	_ = b.checked(b.mark(), &pb.ResponseHeader{Revision: 11})
	if _, ahead := b.watchRewound(11); ahead {
		t.Error("a watch of the new history calls for a check")
	}
	_ = b.checkTerm(b.mark(), "e", 12, &elector.Holder{Token: 12})
	_ = b.checkTerm(b.mark(), "e", 13, &elector.Holder{Token: 3}) // a stale term: owed again
	b.leaseFresh()
	if b.takeRenewOwed() {
		t.Error("a lease granted after the rewind would be given up for it")
	}
}
