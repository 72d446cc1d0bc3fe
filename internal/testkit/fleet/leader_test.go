package fleet

import (
	"net/http"
	"testing"
)

func TestParseWhoami(t *testing.T) {
	for _, tc := range []struct {
		name    string
		resp    Response
		want    Whoami
		wantErr bool
	}{
		{"leader", Response{Status: 200, Body: "c0 c0 7 true"}, Whoami{Self: "c0", Leader: "c0", Token: 7, IsLeader: true}, false},
		{"follower", Response{Status: 200, Body: "c1 c0 7 false"}, Whoami{Self: "c1", Leader: "c0", Token: 7}, false},
		{"no_leader_known", Response{Status: 200, Body: "c1   false"}, Whoami{Self: "c1"}, false},
		{"not_200", Response{Status: http.StatusServiceUnavailable, Body: "c1 c0 7 false"}, Whoami{}, true},
		{"too_few_fields", Response{Status: 200, Body: "c1 c0 7"}, Whoami{}, true},
		{"bad_token", Response{Status: 200, Body: "c1 c0 x false"}, Whoami{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseWhoami(tc.resp)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseWhoami(%+v) = %+v, %v; want %+v, error %v", tc.resp, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseGated(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		want    Gated
		wantErr bool
	}{
		{"with_variant", "c0 7 POST v1", Gated{Self: "c0", Token: 7, Method: "POST", Variant: "v1"}, false},
		{"empty_variant", "c0 7 GET ", Gated{Self: "c0", Token: 7, Method: "GET"}, false},
		{"too_few_fields", "c0 7 GET", Gated{}, true},
		{"bad_token", "c0 seven GET v1", Gated{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseGated(tc.body)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseGated(%q) = %+v, %v; want %+v, error %v", tc.body, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// member answers /whoami from a fixed view.
type member struct {
	id   string
	view Whoami
	err  error
}

func (m *member) String() string          { return m.id }
func (m *member) Whoami() (Whoami, error) { return m.view, m.err }

func TestAgreedLeader(t *testing.T) {
	leader := &member{id: "a", view: Whoami{Self: "a", Leader: "a", Token: 3, IsLeader: true}}
	follower := &member{id: "b", view: Whoami{Self: "b", Leader: "a", Token: 3}}
	for _, tc := range []struct {
		name      string
		fleet     []*member
		want      *member
		wantToken int64
	}{
		{"all_agree", []*member{follower, leader}, leader, 3},
		{"follower_behind", []*member{leader, {id: "b", view: Whoami{Self: "b", Leader: "a", Token: 2}}}, nil, 0},
		{"nobody_leads", []*member{follower, {id: "c", view: Whoami{Self: "c", Leader: "a", Token: 3}}}, nil, 0},
		{"one_unreachable", []*member{leader, {id: "c", err: http.ErrServerClosed}}, nil, 0},
		{"leader_names_another", []*member{{id: "a", view: Whoami{Self: "a", Leader: "b", Token: 3, IsLeader: true}}}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, token, views := AgreedLeader(tc.fleet)
			if got != tc.want || token != tc.wantToken || len(views) != len(tc.fleet) {
				t.Errorf("AgreedLeader = %v, %d, %q; want %v, %d", got, token, views, tc.want, tc.wantToken)
			}
		})
	}
}
