package caddyleader

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// quickstartCaddyfile is what `./xcaddy.sh run` serves by default.
const quickstartCaddyfile = "quickstart.Caddyfile"

// TestQuickstartCaddyfile proves that the quick start adapts and is formatted.
func TestQuickstartCaddyfile(t *testing.T) {
	data, err := os.ReadFile(quickstartCaddyfile)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := adaptCaddyfile(t, string(data)); err != nil {
		t.Fatalf("%s does not adapt: %v", quickstartCaddyfile, err)
	}
	if w, different := caddyfile.FormattingDifference(quickstartCaddyfile, data); different {
		t.Errorf("%s:%d: not formatted: run `caddy fmt --overwrite %s`", quickstartCaddyfile, w.Line, quickstartCaddyfile)
	}
}

// TestLeaderPlaceholdersWhereSet checks every Caddyfile we ship (the quick start, the
// example, every golden and so every recipe) for a handler that uses an {http.leader.*}
// placeholder where no leader matcher or leader_gate has looked at the request yet: there the
// client would get the placeholder's raw text.
func TestLeaderPlaceholdersWhereSet(t *testing.T) {
	setAdaptEnv(t)
	files := []string{quickstartCaddyfile, "Caddyfile.example"}
	goldens, err := filepath.Glob(filepath.Join(goldenAdaptDir, "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, goldens...)
	for _, path := range files {
		var text string
		if strings.HasSuffix(path, ".caddyfiletest") {
			cf, expected := readGolden(t, path)
			if !strings.HasPrefix(expected, "{") {
				continue // a Caddyfile that must not adapt
			}
			text = cf
		} else {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			text = string(data)
		}
		t.Run(filepath.Base(path), func(t *testing.T) {
			adapted, _, err := adaptCaddyfile(t, text)
			if err != nil {
				t.Fatalf("%s does not adapt: %v", path, err)
			}
			for _, raw := range unsetLeaderPlaceholders(t, adapted) {
				t.Errorf("%s: a handler uses {http.leader.*} where no leader matcher or leader_gate has set it: %s", path, raw)
			}
		})
	}
}

// TestUnsetLeaderPlaceholdersFinds is the control of TestLeaderPlaceholdersWhereSet: the
// check flags what it is meant to flag and passes what it should.
func TestUnsetLeaderPlaceholdersFinds(t *testing.T) {
	const global = "{\n\tleader {\n\t\tendpoints 127.0.0.1:2379\n\t}\n}\n"
	tests := []struct {
		name      string
		site      string
		wantFound bool
	}{
		{name: "bare_respond", site: "respond \"{http.leader.self}\"", wantFound: true},
		{name: "matcher_on_the_same_handler", site: "@l leader\nrespond @l \"{http.leader.self}\""},
		{name: "after_a_matcher_that_always_runs", site: "@l leader\nrespond @l 200\nrespond \"{http.leader.id}\""},
		{name: "after_the_gate", site: "leader_gate\nrespond \"{http.leader.token}\""},
		{name: "after_a_gate_that_may_not_run", site: "@w method POST\nleader_gate @w\nrespond \"{http.leader.token}\"", wantFound: true},
		{name: "same_matcher_as_the_gate", site: "@w method POST\nleader_gate @w\nreverse_proxy @w app:9000 {\n\theader_up X-Token {http.leader.token}\n}"},
		{name: "in_a_handle_block_without_matcher", site: "handle /x {\n\trespond \"{http.leader.url}\"\n}", wantFound: true},
		{name: "in_a_handle_block_after_a_gate", site: "leader_gate\nhandle /x {\n\trespond \"{http.leader.url}\"\n}"},
		{name: "matcher_with_another_that_may_stop_first", site: "@l {\n\tpath /a\n\tleader\n}\nrespond @l 200\nrespond \"{http.leader.self}\"", wantFound: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			adapted, _, err := adaptCaddyfile(t, global+":8080 {\n"+tt.site+"\n}\n")
			if err != nil {
				t.Fatal(err)
			}
			found := unsetLeaderPlaceholders(t, adapted)
			if (len(found) > 0) != tt.wantFound {
				t.Errorf("found %q; want found: %v", found, tt.wantFound)
			}
		})
	}
}

// route is the part of an adapted Caddy HTTP route that decides which placeholders are set.
type route struct {
	Match  []map[string]json.RawMessage `json:"match"`
	Handle []json.RawMessage            `json:"handle"`
}

// unsetLeaderPlaceholders returns the handlers (as JSON) of an adapted config that use an
// {http.leader.*} placeholder that no leader matcher or gate can have set by then. It
// follows Caddy's order: routes run in order, a route's handlers in order, and a subroute's
// routes in between. A leader matcher sets the placeholders whenever it is evaluated, so it
// counts for its own route, and for the routes after it when it is its route's only matcher
// (then it is evaluated on every request that gets there); a gate counts for all that follows
// it when its route has no matcher, and else for what follows it in its route and for later
// routes with the same matchers.
func unsetLeaderPlaceholders(t *testing.T, adapted []byte) []string {
	t.Helper()
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []route `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		t.Fatal(err)
	}
	var found []string
	// The matchers of gates that ran only on some requests: a later route with the same
	// matchers runs only on requests that passed the gate.
	gatedMatches := make(map[string]bool)
	var walk func(routes []route, set bool) bool
	walk = func(routes []route, set bool) bool {
		for _, r := range routes {
			always := len(r.Match) == 0
			match, err := json.Marshal(r.Match)
			if err != nil {
				t.Fatal(err)
			}
			ownSet := set || (len(r.Match) > 0 && everySetTestsLeader(r.Match)) || gatedMatches[string(match)]
			for _, raw := range r.Handle {
				var h struct {
					Handler string  `json:"handler"`
					Routes  []route `json:"routes"`
				}
				if err := json.Unmarshal(raw, &h); err != nil {
					t.Fatal(err)
				}
				switch {
				case h.Handler == "subroute":
					if walk(h.Routes, ownSet) && always {
						ownSet = true
					}
				case h.Handler == "leader_gate":
					ownSet = true
					gatedMatches[string(match)] = true
				case !ownSet && strings.Contains(string(raw), "{http.leader."):
					found = append(found, string(raw))
				}
			}
			if onlyLeader(r.Match) || (always && ownSet) {
				set = true
			}
		}
		return set
	}
	for _, srv := range cfg.Apps.HTTP.Servers {
		walk(srv.Routes, false)
	}
	return found
}

// everySetTestsLeader reports whether each matcher set tests leadership (plainly or under
// `not`), so that a route that matched has evaluated a leader matcher.
func everySetTestsLeader(sets []map[string]json.RawMessage) bool {
	for _, set := range sets {
		if !testsLeader(set) {
			return false
		}
	}
	return true
}

func testsLeader(set map[string]json.RawMessage) bool {
	if _, ok := set["leader"]; ok {
		return true
	}
	var not []map[string]json.RawMessage
	if raw, ok := set["not"]; ok && json.Unmarshal(raw, &not) == nil {
		return everySetTestsLeader(not)
	}
	return false
}

// onlyLeader reports whether the route's matchers are a single leader matcher, evaluated
// on every request that reaches the route.
func onlyLeader(sets []map[string]json.RawMessage) bool {
	if len(sets) != 1 || len(sets[0]) != 1 {
		return false
	}
	return testsLeader(sets[0])
}
