package caddyleader

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The fast paths must give exactly what Caddy's replacer gives for the same placeholder.
func TestShardKeyAgreesWithCaddysReplacer(t *testing.T) {
	for _, tc := range []struct {
		name, key, target string
		header            http.Header
	}{
		{"path_segment", "{http.request.uri.path.1}", "/rooms/42/messages", nil},
		{"path_segment_past_the_end", "{http.request.uri.path.5}", "/rooms/42", nil},
		{"path_segment_first", "{http.request.uri.path.0}", "/tenant-a", nil},
		{"path_segment_trailing_slash", "{http.request.uri.path.1}", "/rooms/", nil},
		{"path_segment_root", "{http.request.uri.path.0}", "/", nil},
		{"header", "{http.request.header.X-Tenant}", "/", http.Header{"X-Tenant": {"acme"}}},
		{"header_any_case", "{http.request.header.x-tenant}", "/", http.Header{"X-Tenant": {"acme"}}},
		{"header_missing", "{http.request.header.X-Tenant}", "/", nil},
		{"header_repeated", "{http.request.header.X-Tenant}", "/", http.Header{"X-Tenant": {"a", "b"}}},
		{"query", "{http.request.uri.query.room}", "/?a=1&room=lobby", nil},
		{"query_encoded", "{http.request.uri.query.room}", "/?room=caf%C3%A9", nil},
		{"query_plus", "{http.request.uri.query.room}", "/?room=a+b", nil},
		{"query_missing", "{http.request.uri.query.room}", "/?a=1", nil},
		{"query_repeated", "{http.request.uri.query.room}", "/?room=a&room=b", nil},
		{"composite", "{http.request.host}/{http.request.uri.path.0}", "/docs", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := parseShardKey(tc.key)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, tc.target, nil)
			for name, vals := range tc.header {
				r.Header[name] = vals
			}
			repl := caddy.NewReplacer()
			r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
			want := repl.ReplaceAll(tc.key, "")
			if got := k.of(r, repl); got != want {
				t.Errorf("key %s of %s = %q; Caddy's replacer says %q", tc.key, tc.target, got, want)
			}
		})
	}
}

func TestShardKeyNeedsAPlaceholder(t *testing.T) {
	if _, err := parseShardKey("tenant"); err == nil {
		t.Fatal("a key without a placeholder was accepted: every request would go to one shard")
	}
}

// TestShardKeyRefusesPlaceholdersThatCannotResolve: a misspelt namespace or an unpaired
// brace expands to the same text for every request, so every request would go to one
// shard; such a key is refused as a constant one is.
func TestShardKeyRefusesPlaceholdersThatCannotResolve(t *testing.T) {
	tests := []struct {
		name, key, wantErr string
	}{
		{"misspelt_namespace", "{http.reqest.header.X-Room}", "placeholder {http.reqest.header.X-Room} is not one that resolves"},
		{"misspelt_request_field", "{http.request.heder.X-Room}", "placeholder {http.request.heder.X-Room} is not one"},
		{"caddyfile_shorthand_in_json", "{header.X-Room}", "placeholder {header.X-Room} is not one"},
		{"unclosed", "{http.request.uri.path.1", "has a `{` that is not closed"},
		{"nested_open", "{http.request.uri.path.{1}", "has a `{` that is not closed"},
		{"stray_close", "room-}{http.request.uri.path.1}", "has a `}` that closes no placeholder"},
		{"one_good_one_bad", "{http.request.host}/{http.reqest.uri.path.1}", "placeholder {http.reqest.uri.path.1}"},
		{"namespace_alone", "{http.vars.}", "placeholder {http.vars.} is not one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseShardKey(tt.key)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("parseShardKey(%q) = %v, want an error containing %q", tt.key, err, tt.wantErr)
			}
		})
	}
}

// TestShardKeyAcceptsPlaceholdersThatResolve is the control for the test above.
func TestShardKeyAcceptsPlaceholdersThatResolve(t *testing.T) {
	for _, key := range []string{
		"{http.request.header.X-Room}", "{http.request.uri.path.1}", "{http.request.uri.query.room}",
		"{http.request.host}/{http.request.uri.path.0}", "{http.request.cookie.session}",
		"{http.request.remote.host}", "{http.request.client_ip}", "{http.vars.tenant}",
		"{http.auth.user.id}", "{http.regexp.room.1}", "{env.REGION}-{http.request.uri.path.1}",
		`\{{http.request.uri.path.1}\}`,
	} {
		t.Run(key, func(t *testing.T) {
			if _, err := parseShardKey(key); err != nil {
				t.Fatalf("parseShardKey(%q): %v", key, err)
			}
		})
	}
}
