package caddyleader

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func TestWebhookValidate(t *testing.T) {
	cases := []struct {
		name    string
		hook    Webhook
		wantErr string
	}{
		{"http_url", Webhook{URL: "http://alerts.internal:9000/hook"}, ""},
		{"https_url", Webhook{URL: "https://alerts.internal/hook"}, ""},
		{"no_url", Webhook{}, `url: "" is not an http:// or https:// URL`},
		{"no_scheme", Webhook{URL: "alerts.internal/hook"}, `url: "alerts.internal/hook"`},
		{"negative_timeout", Webhook{URL: "http://a/", Timeout: caddy.Duration(-time.Second)}, "timeout: -1s is negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.hook
			if err := h.Provision(caddy.Context{}); err != nil {
				t.Fatal(err)
			}
			err := h.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestWebhookDelivery: an answer other than 2xx is a failed delivery, which the events app
// logs; a 2xx one is not.
func TestWebhookDelivery(t *testing.T) {
	cases := []struct {
		name    string
		status  int
		wantErr string
	}{
		{"ok", http.StatusOK, ""},
		{"accepted", http.StatusAccepted, ""},
		{"server_error_fails", http.StatusInternalServerError, "answered 500 Internal Server Error"},
		{"redirect_fails", http.StatusFound, "answered 302 Found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got webhookBody
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/elsewhere")
				if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
					t.Error(err)
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			h := Webhook{URL: srv.URL}
			if err := h.Provision(caddy.Context{}); err != nil {
				t.Fatal(err)
			}
			ev, err := caddy.NewEvent(caddy.Context{Context: context.Background()}, EventStoreUnreachable, map[string]any{"self": "node-a"})
			if err != nil {
				t.Fatal(err)
			}
			err = h.Handle(context.Background(), ev)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Handle: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Handle = %v, want an error containing %q", err, tc.wantErr)
			}
			if got.Name != EventStoreUnreachable || got.Data["self"] != "node-a" || got.ID == "" {
				t.Errorf("delivered %+v", got)
			}
		})
	}
}
