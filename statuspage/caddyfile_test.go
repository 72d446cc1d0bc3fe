package statuspage

import (
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddyleader/caddy-leader/internal/testkit/goldentest"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, c := range []struct {
		name, input string
		want        Handler
		err         string // a part of the error; empty when it parses
	}{
		{name: "bare", input: `leader_status`, want: Handler{}},
		{name: "every_option", input: "leader_status {\n\ttitle \"Fleet A\"\n\telections main jobs\n\tadmin_link http://127.0.0.1:2019/leader/status\n}",
			want: Handler{Title: "Fleet A", Elections: []string{"main", "jobs"}, AdminLink: "http://127.0.0.1:2019/leader/status"}},
		{name: "argument_on_the_directive", input: `leader_status main`, err: "wrong argument count"},
		{name: "title_needs_one_argument", input: "leader_status {\n\ttitle a b\n}", err: "wrong argument count"},
		{name: "elections_need_a_name", input: "leader_status {\n\telections\n}", err: "wrong argument count"},
		{name: "unknown_option", input: "leader_status {\n\tresign\n}", err: `unrecognized leader_status option "resign"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.input))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error = %v, want one with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(h, c.want) {
				t.Errorf("got %+v, want %+v", h, c.want)
			}
		})
	}
}

// TestCaddyfileAdapt runs the golden adapt tests in testdata/caddyfile_adapt: the JSON each
// Caddyfile adapts to, or the error it must fail with.
func TestCaddyfileAdapt(t *testing.T) {
	goldentest.RunDir(t, "testdata/caddyfile_adapt")
}
