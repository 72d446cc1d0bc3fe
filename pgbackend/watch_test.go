package pgbackend

import (
	"context"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestWatchReportsHeartbeatsAfterCampaign: a holder's Update that rewrites the same value
// (the elector's heartbeat) is a change every watch reports, including a watch started at
// the revision a Campaign of this backend reported, as an elector's is. Followers judge a
// deposed leader's deadline by the last heartbeat they saw; a watch that stays silent makes
// them take over while it still admits.
func TestWatchReportsHeartbeatsAfterCampaign(t *testing.T) {
	server := pgtest.Start(t)
	holder := newBackend(t, Config{DSN: server.DSN()})
	follower := newBackend(t, Config{DSN: server.DSN()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, tc := range []struct {
		name    string
		watcher *Backend
	}{
		{"the_holders_own_backend", holder},
		{"a_follower_that_lost_the_campaign", follower},
	} {
		t.Run(tc.name, func(t *testing.T) {
			election := "heartbeat-" + tc.name
			lease, _, err := holder.Grant(ctx, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			won, err := holder.Campaign(ctx, election, []byte("record"), lease)
			if err != nil || won.Holder == nil || won.Holder.Lease != lease {
				t.Fatalf("campaign: %+v, %v", won, err)
			}
			base := won
			if tc.watcher != holder {
				otherLease, _, err := tc.watcher.Grant(ctx, 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if base, err = tc.watcher.Campaign(ctx, election, []byte("other"), otherLease); err != nil || base.Holder == nil || base.Holder.Lease != lease {
					t.Fatalf("the follower's campaign: %+v, %v; want the holder's key", base, err)
				}
			}
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			changes := tc.watcher.Watch(wctx, election, base.Revision)
			// Whatever the watch reports of the state it started from comes first.
			for settle := time.After(500 * time.Millisecond); ; {
				select {
				case <-changes:
					continue
				case <-settle:
				}
				break
			}
			for beat := 1; beat <= 2; beat++ {
				ok, err := holder.Update(ctx, election, won.Holder.Token, []byte("record"))
				if err != nil || !ok {
					t.Fatalf("heartbeat %d: Update = %v, %v", beat, ok, err)
				}
				select {
				case o := <-changes:
					if o.Err != nil || o.Holder == nil || o.Holder.Token != won.Holder.Token {
						t.Fatalf("heartbeat %d: the watch reported %+v", beat, o)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("heartbeat %d: the watch reported nothing within 5s (its poll interval is 1s)", beat)
				}
			}
		})
	}
}
