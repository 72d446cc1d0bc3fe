package statuspage

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func TestWriteEvent(t *testing.T) {
	for _, c := range []struct{ name, data, want string }{
		{"one_line", "<p>x</p>", "event: update\ndata: <p>x</p>\n\n"},
		{"every_line_is_a_data_line", "<p>\n<b>x</b>\n</p>\n", "event: update\ndata: <p>\ndata: <b>x</b>\ndata: </p>\n\n"},
		{"carriage_returns_go", "a\r\nb\rc", "event: update\ndata: a\ndata: bc\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			if err := writeEvent(w, "update", []byte(c.data)); err != nil {
				t.Fatal(err)
			}
			if got := w.Body.String(); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestProvisionNeedsTheLeaderApp: the page shows the leader app's elections, and a config
// without one fails to load with an error that says so.
func TestProvisionNeedsTheLeaderApp(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	err := (&Handler{}).Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "leader global option") {
		t.Errorf("Provision without a leader app: %v", err)
	}
	err = (&Handler{AdminLink: "localhost:2019/leader/status"}).Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), "admin_link") {
		t.Errorf("Provision with a relative admin_link: %v", err)
	}
}
