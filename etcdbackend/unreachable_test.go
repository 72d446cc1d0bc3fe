package etcdbackend

import (
	"context"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
)

// TestUnreachable classifies the errors of a real three-member cluster: answers (a lease
// not found) are not transport errors; a lost quorum ("no leader") and every member
// stopped are.
func TestUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	cluster := etcdtest.Start(t, 3)
	b, err := New(Config{Endpoints: cluster.Endpoints(), Prefix: "/unreachable/", DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, _, err := b.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// A renewal of a lease that exists fails only when etcd cannot answer; one of a lease
	// that does not is answered.
	id := lease + 1000
	request := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := b.Renew(ctx, id)
		return err
	}
	for _, tc := range []struct {
		name    string
		disturb func()
		want    bool
	}{
		{name: "lease_not_found_is_an_answer", disturb: func() {}, want: false},
		{name: "no_quorum", disturb: func() { cluster.Stop(t, 0); cluster.Stop(t, 1); id = lease }, want: true},
		{name: "every_member_stopped", disturb: func() { cluster.Stop(t, 2) }, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.disturb()
			// A leader that lost its quorum steps down within an election timeout.
			err := request()
			for deadline := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(deadline); {
				time.Sleep(100 * time.Millisecond)
				err = request()
			}
			if err == nil {
				t.Fatal("the request kept succeeding")
			}
			if got := elector.Unreachable(b, err); got != tc.want {
				t.Fatalf("Unreachable(%v) = %v, want %v", err, got, tc.want)
			}
			t.Logf("%v", err)
		})
	}
}
