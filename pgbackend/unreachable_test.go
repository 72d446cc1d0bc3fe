package pgbackend

import (
	"context"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
)

// TestUnreachable classifies the errors of a real PostgreSQL: an answer (a lease not
// found) is not a transport error; the server stopped, and crashed, are.
func TestUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	server := pgtest.Start(t)
	b := newBackend(t, Config{DSN: server.DSN()})
	request := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := b.Renew(ctx, 12345)
		return err
	}
	for _, tc := range []struct {
		name    string
		disturb func()
		want    bool
	}{
		{name: "lease_not_found_is_an_answer", disturb: func() {}, want: false},
		{name: "server_stopped", disturb: func() { server.Stop(t) }, want: true},
		{name: "server_crashed", disturb: func() { server.Start(t); _ = request(); server.Crash(t) }, want: true},
		{name: "connection_refused", disturb: func() {}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.disturb()
			err := request()
			if err == nil {
				t.Fatal("the request succeeded")
			}
			if got := elector.Unreachable(b, err); got != tc.want {
				t.Fatalf("Unreachable(%v) = %v, want %v", err, got, tc.want)
			}
			t.Logf("%v", err)
		})
	}
}
