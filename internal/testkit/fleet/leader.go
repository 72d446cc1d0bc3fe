package fleet

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Gated is a parsed 200 answer of /gated.
type Gated struct {
	Self    string
	Token   int64
	Method  string
	Variant string
}

// ParseGated parses the body of a 200 answer of /gated.
func ParseGated(body string) (Gated, error) {
	f := strings.Split(body, " ")
	if len(f) != 4 {
		return Gated{}, fmt.Errorf("/gated body %q: want 4 fields", body)
	}
	token, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return Gated{}, fmt.Errorf("/gated body %q: token: %v", body, err)
	}
	return Gated{Self: f[0], Token: token, Method: f[2], Variant: f[3]}, nil
}

// Whoami is an instance's view of the election, from /whoami.
type Whoami struct {
	Self     string
	Leader   string // empty when no leader is known
	Token    int64  // 0 when no leader is known
	IsLeader bool   // this instance may act as leader right now
}

// ParseWhoami parses an answer of /whoami.
func ParseWhoami(resp Response) (Whoami, error) {
	if resp.Status != http.StatusOK {
		return Whoami{}, fmt.Errorf("/whoami: status %d, body %q", resp.Status, resp.Body)
	}
	f := strings.Split(resp.Body, " ")
	if len(f) != 4 {
		return Whoami{}, fmt.Errorf("/whoami body %q: want 4 fields", resp.Body)
	}
	w := Whoami{Self: f[0], Leader: f[1], IsLeader: f[3] == "true"}
	if f[2] != "" {
		var err error
		if w.Token, err = strconv.ParseInt(f[2], 10, 64); err != nil {
			return Whoami{}, fmt.Errorf("/whoami body %q: token: %v", resp.Body, err)
		}
	}
	return w, nil
}

// Member is an instance that can tell who leads: *Instance, or a type that wraps one.
type Member interface {
	comparable
	fmt.Stringer
	Whoami() (Whoami, error)
}

// WaitStableLeader polls /whoami on every member until all of them name the same leader
// and token and the leader says it leads, or within passes (which fails t). It returns
// the leader and token.
func WaitStableLeader[M Member](t T, fleet []M, within time.Duration) (M, int64) {
	t.Helper()
	deadline := time.Now().Add(within)
	var none M
	for {
		leader, token, views := AgreedLeader(fleet)
		if leader != none {
			return leader, token
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader agreed on by all of %v within %v; last views: %s", fleet, within, strings.Join(views, "; "))
			return leader, 0
		}
		time.Sleep(PollInterval)
	}
}

// AgreedLeader asks every member once. If all of them answer, name the same leader and
// token, and the leader says it leads, it returns that leader and token; else the zero M
// and 0. Either way it returns each member's view, for messages.
func AgreedLeader[M Member](fleet []M) (M, int64, []string) {
	var views []string
	var first Whoami
	agree, found := true, false
	var leader, none M
	for i, in := range fleet {
		w, err := in.Whoami()
		if err != nil {
			views = append(views, fmt.Sprintf("%s: %v", in, err))
			agree = false
			continue
		}
		views = append(views, fmt.Sprintf("%+v", w))
		if i == 0 {
			first = w
		}
		if w.Leader == "" || w.Leader != first.Leader || w.Token != first.Token {
			agree = false
		}
		if w.IsLeader {
			if w.Self != w.Leader {
				agree = false
			}
			leader, found = in, true
		}
	}
	if !agree || !found {
		return none, 0, views
	}
	return leader, first.Token, views
}

// Others returns fleet without in.
func Others[M comparable](fleet []M, in M) []M {
	var rest []M
	for _, f := range fleet {
		if f != in {
			rest = append(rest, f)
		}
	}
	return rest
}
