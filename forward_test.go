package caddyleader

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestNotLeaderCatcher(t *testing.T) {
	cases := []struct {
		name       string
		status     int
		marked     bool
		wantCaught bool
	}{
		{"ok_response_passes_through", http.StatusOK, false, false},
		{"plain_503_passes_through", http.StatusServiceUnavailable, false, false},
		{"marked_503_is_swallowed", http.StatusServiceUnavailable, true, true},
		{"marked_non_503_passes_through", http.StatusBadGateway, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			rec.Header().Set("X-Before", "kept")
			c := newNotLeaderCatcher(rec)
			// What reverse_proxy does with an upstream response: copy headers, write the
			// status, copy the body (through ReadFrom when the writer has it).
			c.Header().Set("X-Upstream", "copied")
			if tc.marked {
				c.Header().Set(NotLeaderHeader, "default")
			}
			c.WriteHeader(tc.status)
			if _, err := c.ReadFrom(strings.NewReader("body")); err != nil {
				t.Fatal(err)
			}
			if c.caught != tc.wantCaught {
				t.Fatalf("caught = %v, want %v", c.caught, tc.wantCaught)
			}
			if !tc.wantCaught {
				if rec.Code != tc.status || rec.Body.String() != "body" {
					t.Fatalf("passed through as %d %q", rec.Code, rec.Body.String())
				}
				return
			}
			c.restoreHeader()
			if rec.Body.Len() != 0 || rec.Header().Get("X-Upstream") != "" || rec.Header().Get(NotLeaderHeader) != "" {
				t.Fatalf("swallowed response leaked: body %q, headers %v", rec.Body.String(), rec.Header())
			}
			if rec.Header().Get("X-Before") != "kept" {
				t.Fatalf("headers set before the try were lost: %v", rec.Header())
			}
		})
	}
}

func TestBufferBody(t *testing.T) {
	cases := []struct {
		name           string
		body           io.Reader
		contentLength  int64
		wantReplayable bool
		wantBody       string
	}{
		{"no_body", nil, 0, true, ""},
		{"small_body_is_buffered", strings.NewReader("hello"), 5, true, "hello"},
		{"streamed_body_of_unknown_length_is_not", strings.NewReader("hello"), -1, false, ""},
		{"body_over_the_limit_is_not", strings.NewReader(strings.Repeat("x", replayLimit+1)), replayLimit + 1, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", tc.body)
			r.ContentLength = tc.contentLength
			body, replayable, err := bufferBody(r)
			if err != nil {
				t.Fatal(err)
			}
			if replayable != tc.wantReplayable {
				t.Fatalf("replayable = %v, want %v", replayable, tc.wantReplayable)
			}
			if string(body) != tc.wantBody {
				t.Fatalf("buffered %q, want %q", body, tc.wantBody)
			}
			if !replayable {
				// The body must still be readable in full by the one try it gets.
				rest, _ := io.ReadAll(r.Body)
				if int64(len(rest)) != max(tc.contentLength, 5) {
					t.Fatalf("body left for the single try: %d bytes", len(rest))
				}
			}
		})
	}
}
