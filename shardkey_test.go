package caddyleader

import (
	"net/http"
	"net/http/httptest"
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
