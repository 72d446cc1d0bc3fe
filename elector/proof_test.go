package elector

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestEveryWayATermStartsOwesItsProof walks every way a term of this instance can start
// (each case of proofLocked) against every obligation a proof can carry, for each kind of
// candidate: what the new term owes must be exactly what the sequence leaves unproven, and a
// term that follows this instance's own unproven term must carry that very proof on.
func TestEveryWayATermStartsOwesItsProof(t *testing.T) {
	// A new obligation is a new field of proof: add it to want below and to every case,
	// and give it a discharge in one place (see proof.go).
	var owes []string
	pt := reflect.TypeFor[proof]()
	for i := range pt.NumField() {
		if name := pt.Field(i).Name; strings.HasPrefix(name, "owes") {
			owes = append(owes, name)
		}
	}
	if !reflect.DeepEqual(owes, []string{"owesHeartbeat", "owesFailsafe"}) {
		t.Fatalf("proof owes %v; this table knows owesHeartbeat and owesFailsafe only: extend it", owes)
	}

	const token, ttl = 50, 2 * time.Second
	now := time.Now()
	openOwn := newProof(40, 30, now.Add(time.Hour), true, true)
	seen := observedTerm{token: 45, lease: 9, ttl: ttl, seen: now.Add(-time.Second)}
	type want struct {
		heartbeat bool
		pred      int64 // the term whose acknowledgement discharges it
		inherits  bool  // the proof is the own term's, carried on
	}
	cases := []struct {
		name string
		seen observedTerm
		own  ownTerm
		obs  Observation
		// ownLease makes the seen term one of this candidate's own leases.
		ownLease bool
		want     want
	}{
		{name: "store_names_a_newer_term_than_the_one_seen", seen: seen, obs: Observation{Prev: 47},
			want: want{heartbeat: true, pred: 47}},
		{name: "store_names_a_newer_term_acknowledged", seen: seen, obs: Observation{Prev: 47, PrevReleased: true}},
		{name: "store_names_own_term_after_the_one_seen", seen: seen, own: ownTerm{token: 47, proof: nothingOwed}, obs: Observation{Prev: 47, PrevReleased: true},
			want: want{heartbeat: true}},
		{name: "store_names_a_term_older_than_the_one_seen", seen: seen, obs: Observation{Prev: 44, PrevReleased: true},
			want: want{heartbeat: true}},
		{name: "own_term_named_last_and_proven", own: ownTerm{token: 40, proof: nothingOwed}, obs: Observation{Prev: 40}},
		{name: "own_term_named_last_and_open", own: ownTerm{token: 40, proof: openOwn}, obs: Observation{Prev: 40},
			want: want{heartbeat: true, pred: 30, inherits: true}},
		// A campaign applied whose answer was lost: the retry finds the key held under this
		// lease, and the store names no term before it. Whatever this instance saw or held
		// last, terms may have come and gone since: it owes what a term that saw nothing owes.
		{name: "answer_lost_after_own_term", own: ownTerm{token: 40, proof: openOwn},
			want: want{heartbeat: true}},
		{name: "own_term_after_a_gap", own: ownTerm{token: 40, proof: nothingOwed},
			want: want{heartbeat: true}},
		{name: "seen_term_acknowledged", seen: seen, obs: Observation{Prev: 45, PrevReleased: true}},
		{name: "seen_term_not_acknowledged", seen: seen, obs: Observation{Prev: 45},
			want: want{heartbeat: true, pred: 45}},
		{name: "answer_lost_after_seen_term", seen: seen,
			want: want{heartbeat: true}},
		{name: "seen_term_under_this_candidates_lease", seen: seen, ownLease: true, obs: Observation{Prev: 45}},
		{name: "answer_lost_after_a_term_under_this_candidates_lease", seen: seen, ownLease: true,
			want: want{heartbeat: true}},
		{name: "unseen_term_acknowledged", obs: Observation{Prev: 45, PrevReleased: true}},
		{name: "unseen_term_not_acknowledged", obs: Observation{Prev: 45},
			want: want{heartbeat: true, pred: 45}},
		{name: "nothing_known_at_all", want: want{heartbeat: true}},
	}
	kinds := []struct {
		name string
		cfg  Config
		// failsafe says whether a fresh proof owes the failsafe part, given whether it
		// owes the heartbeat part.
		failsafe func(heartbeat bool) bool
	}{
		{"plain", Config{TTL: ttl}, func(bool) bool { return false }},
		{"fences_rosters", Config{TTL: ttl, Fence: noTransport{}}, func(heartbeat bool) bool { return heartbeat }},
		{"failsafe", Config{TTL: ttl, Failsafe: &FailsafeConfig{URL: "http://self", Transport: noTransport{}}}, func(bool) bool { return true }},
	}
	for _, k := range kinds {
		for _, tc := range cases {
			t.Run(k.name+"/"+tc.name, func(t *testing.T) {
				c := &Candidate{cfg: k.cfg}
				if tc.ownLease {
					c.abandoned = tc.seen.lease
				}
				e := &Election{c: c, prev: tc.seen, own: tc.own}
				p := e.proofLocked(token, tc.obs, now, ttl)
				if tc.want.inherits {
					if p != tc.own.proof {
						t.Fatal("a term that follows this instance's own open term does not carry its proof on")
					}
					return
				}
				heartbeat, failsafe := p.owes()
				if heartbeat != tc.want.heartbeat || failsafe != k.failsafe(tc.want.heartbeat) {
					t.Fatalf("owes heartbeat %v, failsafe %v; want %v, %v", heartbeat, failsafe, tc.want.heartbeat, k.failsafe(tc.want.heartbeat))
				}
				if heartbeat && p.token != tc.want.pred {
					t.Fatalf("asks term %d for its acknowledgement, want %d", p.token, tc.want.pred)
				}
				if p.fenceAs != token {
					t.Fatalf("a fresh proof fences as term %d, want %d", p.fenceAs, token)
				}
				if p.isProven() != (!heartbeat && !failsafe) {
					t.Fatalf("proven %v while owing heartbeat %v, failsafe %v", p.isProven(), heartbeat, failsafe)
				}
			})
		}
	}
}

// noTransport is a FailsafeTransport for a test that never sends.
type noTransport struct{}

func (noTransport) Ask(context.Context, string, []byte) ([]byte, error) {
	return nil, errors.New("no transport in this test")
}
