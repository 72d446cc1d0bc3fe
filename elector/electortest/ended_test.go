package electortest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
)

// TestHistorySaysHowEachTermEnded ends the first term of a three-instance fleet in each way
// a term can end, and reads from the store how its successor recorded it: the holder's own
// word where it could still say why it stopped, "crashed" where it could not.
func TestHistorySaysHowEachTermEnded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// end ends the term of leader, within ctx.
		end  func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error
		want string
	}{
		{
			name: "resign",
			end: func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error {
				return leader.Election.Resign(ctx, time.Hour)
			},
			want: elector.EndedResigned,
		},
		{
			name: "resign_asked_through_the_store",
			end: func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error {
				return aPeer(f, leader).Election.RequestResign(ctx, time.Hour)
			},
			want: elector.EndedResigned,
		},
		{
			name: "transfer",
			end: func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error {
				return leader.Election.Transfer(ctx, aPeer(f, leader).ID, within)
			},
			want: elector.EndedTransferred,
		},
		{
			name: "shutdown",
			end: func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error {
				leader.Candidate.Release(leader.Election)
				return leader.Candidate.Close(ctx)
			},
			want: elector.EndedHandedOver,
		},
		{
			name: "key_deleted_by_an_operator",
			end: func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error {
				s.Delete("main")
				return nil
			},
			want: elector.EndedKeyDeleted,
		},
		{
			// Writes of the key fail while renewals go through (a full disk): the leader
			// stops at its heartbeat deadline and says so.
			name: "heartbeats_fail",
			end: func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error {
				client(f, leader).Fail("Update", -1, errors.New("disk full"))
				return nil
			},
			want: elector.EndedDeadlineMissed,
		},
		{
			// Cut off for good, the leader cannot say anything: its successor waits out
			// its deadline.
			name: "cut_off",
			end: func(ctx context.Context, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member) error {
				client(f, leader).SetDown(errors.New("cut off"))
				return nil
			},
			want: elector.EndedCrashed,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, s := fakeFleet(t, 3)
			leader, token := f.Leader(within)
			ctx, cancel := context.WithTimeout(context.Background(), within)
			defer cancel()
			if err := tc.end(ctx, f, s, leader); err != nil {
				t.Fatal(err)
			}
			awaitEnded(t, f, s, leader, token, tc.want)
		})
	}
}

// TestHistoryOfATermAnOlderReleaseEnded: an instance of a release before acknowledgements
// said why acknowledges with no reason; its successor records its term as handed over.
func TestHistoryOfATermAnOlderReleaseEnded(t *testing.T) {
	t.Parallel()
	s := electortest.NewStore()
	f := electortest.StartFleet(t, electortest.FleetOptions{
		Size: 2, TTL: ttl, Now: s.Now,
		Backend: func(testing.TB, int) elector.Backend { return olderRelease{s.Client()} },
	})
	coldStart(t, f, s)
	leader, token := f.Leader(within)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := leader.Election.Resign(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	awaitEnded(t, f, s, leader, token, elector.EndedHandedOver)
}

// olderRelease writes acknowledgements as a release before their why existed did.
type olderRelease struct{ *electortest.Client }

func (o olderRelease) Acknowledge(ctx context.Context, election string, token int64, lease elector.LeaseID, _ string) error {
	return o.Client.Acknowledge(ctx, election, token, lease, "")
}

func (o olderRelease) Release(ctx context.Context, election string, token int64, lease elector.LeaseID, _ string) error {
	return o.Client.Release(ctx, election, token, lease, "")
}

// awaitEnded waits until the store's history records leader's term token as ended the way
// want says. Its successor may be leader itself: an instance that lost its key while it
// could still campaign may win the next term.
func awaitEnded(t *testing.T, f *electortest.Fleet, s *electortest.Store, leader *electortest.Member, token int64, want string) {
	t.Helper()
	keepTime(t, s) // a successor that must wait out a deadline needs the clock to move
	var got elector.PastTerm
	f.Await("the ended term in the history", within, func() bool {
		list, err := aPeer(f, leader).Election.History(context.Background())
		for _, p := range list {
			if err == nil && p.Token == token {
				got = p
				return true
			}
		}
		return false
	})
	if got.Ended != want || got.Leader != leader.ID {
		t.Fatalf("history records term %d of %s as %q (followed by %s); want %q", token, got.Leader, got.Ended, got.Successor, want)
	}
}

// TestHistoryRecordsACrashsLastHeartbeat: the successor of a leader cut off for good records
// when it last saw the leader's heartbeat and when it first admitted itself, so that the
// outage can be counted from the heartbeat rather than from End, a TTL later.
func TestHistoryRecordsACrashsLastHeartbeat(t *testing.T) {
	t.Parallel()
	f, s := fakeFleet(t, 3)
	leader, token := f.Leader(within)
	client(f, leader).SetDown(errors.New("cut off"))
	awaitEnded(t, f, s, leader, token, elector.EndedCrashed)
	list, err := aPeer(f, leader).Election.History(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		if p.Token != token {
			continue
		}
		if p.LastHeartbeat.IsZero() || p.LastHeartbeat.After(p.End) || p.SuccessorAdmitted.Before(p.End) {
			t.Fatalf("term %d: last heartbeat %v, end %v, successor admitted %v; want heartbeat <= end <= admitted",
				token, p.LastHeartbeat, p.End, p.SuccessorAdmitted)
		}
	}
}
