// Package jobstest is the conformance suite of jobs.Store: every store that keeps job
// records (the in-memory one, etcd, PostgreSQL, Kubernetes) passes it.
package jobstest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/jobs"
)

// Run checks that a store honours jobs.Store's contract. newHarness is the factory the
// store's elector conformance suite (electortest.Run) gets, called once per subtest; each
// client it makes must implement jobs.Store.
func Run(t *testing.T, newHarness func(t *testing.T) electortest.Harness) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"holder_writes_and_every_client_reads", holderWrites},
		{"other_tokens_change_nothing", otherTokens},
		{"nobody_holds_the_election", nobodyHolds},
		{"ended_term_cannot_write_and_its_record_outlives_it", endedTerms},
		{"jobs_are_independent", jobsIndependent},
		{"elections_are_independent", electionsIndependent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			tc.run(t, &harness{Harness: h, t: t, election: h.Election()})
		})
	}
}

// within bounds every request and every wait for a watch.
const within = 10 * time.Second

type harness struct {
	electortest.Harness
	t        *testing.T
	election string
}

// client is one candidate's connection to the store, with a lease.
type client struct {
	elector.Backend
	jobs.Store
	lease elector.LeaseID
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	h.t.Cleanup(cancel)
	return ctx
}

// client returns a new client of the store with a granted lease.
func (h *harness) client() *client {
	h.t.Helper()
	b := h.NewClient(h.t)
	h.t.Cleanup(func() { b.Close() })
	s, ok := b.(jobs.Store)
	if !ok {
		h.t.Fatalf("%T does not implement jobs.Store", b)
	}
	lease, _, err := b.Grant(h.ctx(), h.TTL)
	if err != nil {
		h.t.Fatalf("Grant: %v", err)
	}
	return &client{Backend: b, Store: s, lease: lease}
}

// win has c campaign for election and returns its token; it fails the test unless c wins.
func (h *harness) win(c *client, election string) int64 {
	h.t.Helper()
	o, err := c.Campaign(h.ctx(), election, []byte("holder"), c.lease)
	if err != nil || o.Holder == nil || o.Holder.Lease != c.lease {
		h.t.Fatalf("Campaign(%s) = %+v, %v; want a win", election, o.Holder, err)
	}
	return o.Holder.Token
}

// put writes job's record in election under token and fails the test unless the answer
// is want.
func (h *harness) put(c *client, election, job string, token int64, value string, want bool) {
	h.t.Helper()
	ok, err := c.PutJobRecord(h.ctx(), election, job, token, []byte(value))
	if err != nil || ok != want {
		h.t.Fatalf("PutJobRecord(%s, %s, token %d, %q) = %v, %v; want %v", election, job, token, value, ok, err, want)
	}
}

// read fails the test unless job's record in election, read by c, is want (nil: none).
func (h *harness) read(c *client, election, job string, want []byte) {
	h.t.Helper()
	got, err := c.JobRecord(h.ctx(), election, job)
	if err != nil {
		h.t.Fatalf("JobRecord(%s, %s): %v", election, job, err)
	}
	if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
		h.t.Fatalf("JobRecord(%s, %s) = %q, want %q", election, job, got, want)
	}
}

// record is a value as a runner writes it, with bytes no text encoding keeps as they are.
func record(s string) string { return "\x00\xff" + `{"started":"` + s + `"}` }

func holderWrites(t *testing.T, h *harness) {
	a, b := h.client(), h.client()
	tok := h.win(a, h.election)
	h.put(a, h.election, "backup", tok, record("1"), true)
	h.read(b, h.election, "backup", []byte(record("1")))
	// A heartbeat between two writes (a beacon instead, in a grouped election) leaves the
	// term's writes alone.
	if ok, err := a.Update(h.ctx(), h.election, tok, []byte("holder")); err != nil || !ok {
		t.Fatalf("heartbeat: %v, %v", ok, err)
	}
	h.put(a, h.election, "backup", tok, record("2"), true)
	h.read(b, h.election, "backup", []byte(record("2")))
	h.read(a, h.election, "backup", []byte(record("2")))
}

func otherTokens(t *testing.T, h *harness) {
	a, b := h.client(), h.client()
	tok := h.win(a, h.election)
	h.put(a, h.election, "backup", tok, record("1"), true)
	for _, tc := range []struct {
		name  string
		token int64
	}{
		{"an_older_term", tok - 1},
		{"a_made_up_later_one", tok + 1},
		{"zero", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &harness{Harness: h.Harness, t: t, election: h.election}
			h.put(b, h.election, "backup", tc.token, record("stale"), false)
			h.read(b, h.election, "backup", []byte(record("1")))
		})
	}
}

func nobodyHolds(t *testing.T, h *harness) {
	a := h.client()
	h.read(a, h.election, "backup", nil)
	h.put(a, h.election, "backup", 1, record("1"), false)
	h.read(a, h.election, "backup", nil)
}

// endedTerms ends a term each way a term ends: its old token writes no more, and the
// record it wrote is there for the next term, which writes under its own token.
func endedTerms(t *testing.T, h *harness) {
	for _, tc := range []struct {
		name string
		end  func(h *harness, a, b *client, tok int64)
	}{
		{"released", func(h *harness, a, _ *client, tok int64) {
			if err := a.Release(h.ctx(), h.election, tok, a.lease, elector.EndedResigned); err != nil {
				h.t.Fatal(err)
			}
		}},
		{"lease_revoked", func(h *harness, a, _ *client, _ int64) {
			if err := a.Revoke(h.ctx(), a.lease); err != nil {
				h.t.Fatal(err)
			}
		}},
		{"lease_expired", func(h *harness, a, b *client, _ int64) {
			seen := h.observe(b)
			h.Advance(h.TTL + h.TTL/2)
			h.untilVacant(b, seen.Revision)
		}},
		{"key_deleted", func(h *harness, a, b *client, tok int64) {
			// As an operator's delete; Expire is the one every store has.
			seen := h.observe(b)
			if ok, err := b.Expire(h.ctx(), h.election, tok, seen.Revision); err != nil || !ok {
				h.t.Fatalf("Expire = %v, %v; want true", ok, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &harness{Harness: h.Harness, t: t, election: h.Election()}
			a, b := h.client(), h.client()
			old := h.win(a, h.election)
			h.put(a, h.election, "backup", old, record("1"), true)
			tc.end(h, a, b, old)
			h.put(a, h.election, "backup", old, record("late"), false)
			h.read(b, h.election, "backup", []byte(record("1")))

			next := h.client() // granted now: an expiry above would have taken an older lease
			tok := h.win(next, h.election)
			h.read(next, h.election, "backup", []byte(record("1")))
			h.put(next, h.election, "backup", tok, record("2"), true)
			h.put(a, h.election, "backup", old, record("late"), false)
			h.read(b, h.election, "backup", []byte(record("2")))
		})
	}
}

func (h *harness) observe(c *client) elector.Observation {
	h.t.Helper()
	o, err := c.Observe(h.ctx(), h.election)
	if err != nil {
		h.t.Fatalf("Observe: %v", err)
	}
	return o
}

// untilVacant waits for c's watch of the election from revision rev on to report it
// vacant: a store may notice an expired lease some time after its ttl.
func (h *harness) untilVacant(c *client, rev int64) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for o := range c.Watch(ctx, h.election, rev) {
		switch {
		case o.Err != nil:
			h.t.Fatalf("watch broke: %v", o.Err)
		case o.Holder == nil:
			return
		}
	}
	h.t.Fatalf("the watch did not report the key vacant within %s", within)
}

// jobsIndependent: each job of an election has a record of its own, whatever its name
// (a long one, with characters a store's key or object names may not hold, too).
func jobsIndependent(t *testing.T, h *harness) {
	const report = "Nightly report: EU & US, every tenant/region, all formats (v2)"
	a := h.client()
	tok := h.win(a, h.election)
	h.put(a, h.election, "backup", tok, record("b1"), true)
	h.put(a, h.election, report, tok, record("r1"), true)
	h.put(a, h.election, "backup", tok, record("b2"), true)
	h.read(a, h.election, "backup", []byte(record("b2")))
	h.read(a, h.election, report, []byte(record("r1")))
	h.read(a, h.election, report+" ", nil)
	h.read(a, h.election, "never-written", nil)
}

// electionsIndependent: each shard of a set is an election of its own, held under its own
// token, with its own records.
func electionsIndependent(t *testing.T, h *harness) {
	a, b := h.client(), h.client()
	other := h.Election()
	tokA, tokB := h.win(a, h.election), h.win(b, other)
	h.put(a, h.election, "backup", tokA, record("a"), true)
	h.read(b, other, "backup", nil)
	h.put(a, other, "backup", tokA, record("a in b's"), false)
	h.put(b, other, "backup", tokB, record("b"), true)
	h.read(a, h.election, "backup", []byte(record("a")))
	h.read(a, other, "backup", []byte(record("b")))
}
