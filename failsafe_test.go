package caddyleader

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

func TestFailsafeNote(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		st   *elector.FailsafeStatus
		want string
	}{
		{name: "off", st: nil, want: ""},
		{name: "enabled_idle", st: &elector.FailsafeStatus{Enabled: true}, want: ""},
		{name: "leading", st: &elector.FailsafeStatus{Enabled: true, Active: true, Since: now.Add(-12 * time.Second), Rounds: 36, Refused: 1, Cause: "renew: context deadline exceeded"},
			want: "failsafe: leading without the store for 12s, while every peer confirms (36 rounds, 1 refused); cause: renew: context deadline exceeded"},
		{name: "confirming", st: &elector.FailsafeStatus{Enabled: true, Confirming: 7, ConfirmingFor: 1730 * time.Millisecond},
			want: "failsafe: keeping term 7 alive for 1.7s more (the leader lost the store)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := failsafeNote(tc.st, now); got != tc.want {
				t.Fatalf("failsafeNote = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFailsafeDefaultURL(t *testing.T) {
	for _, tc := range []struct {
		name, listen, url, advertise, want string
	}{
		{name: "from_advertise", listen: ":7444", advertise: "https://10.0.0.5:8443", want: "http://10.0.0.5:7444"},
		{name: "explicit", listen: ":7444", url: "http://peer.internal:9", advertise: "http://10.0.0.5:8080", want: "http://peer.internal:9"},
		{name: "no_advertise", listen: ":7444", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Failsafe{Listen: tc.listen, URL: tc.url}
			f.provision(tc.advertise)
			if f.URL != tc.want {
				t.Fatalf("url = %q, want %q", f.URL, tc.want)
			}
			if err := f.check(6 * time.Second); (err != nil) != (tc.want == "") || err != nil && !strings.HasPrefix(err.Error(), "failsafe: url") {
				t.Fatalf("check: %v", err)
			}
		})
	}
}
