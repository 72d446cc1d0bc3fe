package caddyleader

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/fleet"
	"github.com/caddyleader/caddy-leader/internal/freeport"
)

// TestLeaderCommand runs the `caddy leader` subcommands against the admin API of a Caddy
// started in this process, campaigning in a real etcd.
func TestLeaderCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	adminPort := freeport.MustPick(t, 1)[0]
	admin := fmt.Sprintf("127.0.0.1:%d", adminPort)
	config := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"apps": {"leader": {"endpoints": [%q], "prefix": "/cmd-test/", "ttl": "2s",
			"instance_id": "cmd-node", "advertise": "http://127.0.0.1:1", "elections": ["cmd"], "priority": 7}}}`,
		admin, cluster.Endpoint(0))
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	status := func(t *testing.T) ElectionStatus {
		t.Helper()
		var out bytes.Buffer
		if err := leaderStatus(&out, admin, true); err != nil {
			t.Fatal(err)
		}
		var got struct{ Elections []ElectionStatus }
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("status --json printed %q: %v", out.String(), err)
		}
		if len(got.Elections) != 1 {
			t.Fatalf("status --json lists %d elections, want 1: %s", len(got.Elections), out.String())
		}
		return got.Elections[0]
	}
	// Waiting for the first campaign is not a timing assertion: the test asserts what the
	// commands show once the instance leads.
	deadline := time.Now().Add(10 * time.Second)
	for status(t).Role != "leader" {
		if time.Now().After(deadline) {
			t.Fatalf("never elected: %+v", status(t))
		}
		time.Sleep(20 * time.Millisecond)
	}

	t.Run("status_json_is_the_admin_api_list", func(t *testing.T) {
		s := status(t)
		if s.Election != "cmd" || s.Self != "cmd-node" || s.LeaderID != "cmd-node" || s.Token <= 0 || s.LeaseRemaining <= 0 {
			t.Errorf("status --json = %+v", s)
		}
	})

	t.Run("status_table_has_a_row_per_election", func(t *testing.T) {
		var out bytes.Buffer
		if err := leaderStatus(&out, admin, false); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("status printed %d lines, want header and one row:\n%s", len(lines), out.String())
		}
		header := strings.Fields(lines[0])
		wantHeader := []string{"ELECTION", "CANDIDATE", "ROLE", "LEADER", "TOKEN", "LEASE", "LEFT", "LAST", "CONTACT", "HEALTHY", "URL"}
		if strings.Join(header, " ") != strings.Join(wantHeader, " ") {
			t.Errorf("header = %q", lines[0])
		}
		row := strings.Fields(lines[1])
		token := fmt.Sprint(status(t).Token)
		if len(row) != 10 || row[0] != "cmd" || row[1] != "cmd-node" || row[2] != "leader" || row[3] != "cmd-node" ||
			row[4] != token || row[6] != "ago" && row[7] != "ago" || row[8] != "yes" || row[9] != "http://127.0.0.1:1" {
			t.Errorf("row = %q, want cmd cmd-node leader cmd-node %s <lease> <contact> ago yes http://127.0.0.1:1", lines[1], token)
		}
	})

	t.Run("status_lists_every_candidate_of_the_fleet", func(t *testing.T) {
		backend, err := etcdbackend.New(etcdbackend.Config{Endpoints: []string{cluster.Endpoint(0)}, Prefix: "/cmd-test/"})
		if err != nil {
			t.Fatal(err)
		}
		// The peer joins while cmd-node leads, and leaves (revoking its lease, and with it
		// its entry) when this subtest ends.
		_, peer := fleet.StartCandidate(t, elector.Config{ID: "peer", URL: "http://127.0.0.1:2", TTL: 2 * time.Second, Backend: backend}, "cmd")
		row := func(want string) string {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				var out bytes.Buffer
				if err := leaderStatus(&out, admin, false); err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(out.String(), "\n") {
					if f := strings.Fields(line); len(f) > 1 && f[1] == "peer" && strings.Join(f, " ") == want {
						return out.String()
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("status never showed the row %q:\n%s", want, out.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		token := fmt.Sprint(status(t).Token)
		table := row("cmd peer follower cmd-node " + token + " - - yes http://127.0.0.1:2")
		if !strings.Contains(strings.Join(strings.Fields(table), " "), "cmd cmd-node leader cmd-node "+token) {
			t.Errorf("the table lost this instance's row:\n%s", table)
		}
		s := status(t)
		if len(s.Candidates) != 2 || s.Candidates[0].ID != "cmd-node" || s.Candidates[0].URL != "http://127.0.0.1:1" ||
			!s.Candidates[0].Healthy || s.Candidates[0].Priority != 7 || s.Candidates[1].ID != "peer" || s.Candidates[1].Priority != 1 {
			t.Errorf("status --json candidates = %+v, want cmd-node (priority 7) and peer (1), healthy, with their URLs", s.Candidates)
		}
		// A candidate that resigns with a hold-off announces that it stays out.
		if err := peer[0].Resign(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		row("cmd peer follower cmd-node " + token + " - - no http://127.0.0.1:2")
	})

	t.Run("transfer_to_an_unknown_candidate_fails_naming_it", func(t *testing.T) {
		var out bytes.Buffer
		err := leaderTransfer(&out, admin, "", "nobody")
		if err == nil || !strings.Contains(err.Error(), "nobody") || !strings.Contains(err.Error(), "400") {
			t.Errorf("transfer --to nobody: err = %v, output %q", err, out.String())
		}
		if s := status(t); s.Role != "leader" {
			t.Errorf("after a failed transfer the role is %s", s.Role)
		}
	})

	t.Run("transfer_needs_to", func(t *testing.T) {
		if err := leaderTransfer(new(bytes.Buffer), admin, "cmd", ""); err == nil || !strings.Contains(err.Error(), "--to") {
			t.Errorf("transfer without --to: err = %v", err)
		}
	})

	t.Run("unknown_election_is_an_error", func(t *testing.T) {
		err := leaderResign(new(bytes.Buffer), admin, "other", "")
		if err == nil || !strings.Contains(err.Error(), "other") || !strings.Contains(err.Error(), "404") {
			t.Errorf("resign --election other: err = %v", err)
		}
	})

	t.Run("history_lists_the_terms_every_instance_ended", func(t *testing.T) {
		backend, err := etcdbackend.New(etcdbackend.Config{Endpoints: []string{cluster.Endpoint(0)}, Prefix: "/cmd-test/"})
		if err != nil {
			t.Fatal(err)
		}
		peerCand, peer := fleet.StartCandidate(t, elector.Config{ID: "peer2", URL: "http://127.0.0.1:3", TTL: 2 * time.Second, Backend: backend}, "cmd")
		first := status(t).Token
		// The peer learns of cmd-node's term, then leads by a transfer, and hands back by
		// leaving: each successor records the term it ended.
		for deadline := time.Now().Add(10 * time.Second); peer[0].Term().Token != first; {
			if time.Now().After(deadline) {
				t.Fatalf("the peer never saw term %d: %+v", first, peer[0].Term())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := leaderTransfer(new(bytes.Buffer), admin, "cmd", "peer2"); err != nil {
			t.Fatal(err)
		}
		// The transfer returns once cmd-node has let go; the peer's term counts once it
		// admits (it has settled, and it records the term it ended then).
		for deadline := time.Now().Add(10 * time.Second); !peer[0].Term().Leading(time.Now()); {
			if time.Now().After(deadline) {
				t.Fatalf("the peer never led after the transfer: %+v", peer[0].Term())
			}
			time.Sleep(20 * time.Millisecond)
		}
		second := peer[0].Term().Token
		if err := peerCand.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		var rows []string
		for deadline := time.Now().Add(10 * time.Second); ; {
			var out bytes.Buffer
			if err := leaderHistory(&out, admin, "", false); err != nil {
				t.Fatal(err)
			}
			rows = nil
			for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n")[1:] {
				f := strings.Fields(line)
				rows = append(rows, strings.Join(append(f[:3:3], f[len(f)-3:]...), " "))
			}
			want := []string{
				fmt.Sprintf("cmd %d cmd-node handed over peer2", first),
				fmt.Sprintf("cmd %d peer2 handed over cmd-node", second),
			}
			if strings.Join(rows, "\n") == strings.Join(want, "\n") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("history rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
			}
			time.Sleep(20 * time.Millisecond)
		}
		var out bytes.Buffer
		if err := leaderHistory(&out, admin, "cmd", true); err != nil {
			t.Fatal(err)
		}
		var h HistoryStatus
		if err := json.Unmarshal(out.Bytes(), &h); err != nil || h.Election != "cmd" || len(h.Terms) != 2 ||
			h.Terms[1].Leader != "peer2" || h.Terms[1].URL != "http://127.0.0.1:3" || h.Terms[1].SuccessorToken <= second {
			t.Errorf("history --json = %s (%v)", out.String(), err)
		}
		if s := status(t); s.Role != "leader" {
			t.Fatalf("cmd-node does not lead again: %+v", s)
		}
	})

	t.Run("resign_hands_over_and_holds_off", func(t *testing.T) {
		before := status(t)
		var out bytes.Buffer
		if err := leaderResign(&out, admin, "", "1m"); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("cmd-node resigned election cmd (term %d); it stays out for 1m0s\n", before.Token)
		if out.String() != want {
			t.Errorf("resign printed %q, want %q", out.String(), want)
		}
		// The only candidate holds off for a minute: nobody leads meanwhile.
		if s := status(t); s.Role == "leader" || s.LeaderID == "cmd-node" {
			t.Errorf("after resign: %+v", s)
		}
	})

	t.Run("no_admin_api_is_an_error", func(t *testing.T) {
		if err := leaderStatus(new(bytes.Buffer), fmt.Sprintf("127.0.0.1:%d", freeport.MustPick(t, 1)[0]), false); err == nil {
			t.Error("status against a closed port succeeded")
		}
	})
}

func TestStatusTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name string
		in   ElectionStatus
		want []string
	}{
		{"leader", ElectionStatus{Election: "main", Self: "a", Role: "leader", LeaderID: "a", LeaderURL: "http://a", Token: 42,
			LeaseRemaining: 7.26, LastContact: now.Add(-1500 * time.Millisecond)},
			[]string{"main a leader a 42 7.3s 1.5s ago yes http://a"}},
		{"candidate_without_lease_or_leader", ElectionStatus{Election: "main", Self: "b", Role: "candidate"},
			[]string{"main b candidate - - 0s never no -"}},
		{"follower_lists_the_fleet_from_the_registry", ElectionStatus{Election: "main", Self: "b", Role: "follower",
			LeaderID: "a", LeaderURL: "http://a", Token: 42, LeaseRemaining: 5, LastContact: now.Add(-time.Second),
			Candidates: []CandidateStatus{{ID: "a", URL: "http://a", Healthy: true}, {ID: "b", URL: "http://b", Healthy: true}, {ID: "c", URL: "http://c"}}},
			[]string{
				"main b follower a 42 5s 1s ago yes http://b",
				"main a leader a 42 - - yes http://a",
				"main c follower a 42 - - no http://c",
			}},
		{"this_instance_staying_out_is_unhealthy", ElectionStatus{Election: "main", Self: "b", Role: "candidate",
			LeaseRemaining: 5, LastContact: now.Add(-time.Second), Candidates: []CandidateStatus{{ID: "b", URL: "http://b"}}},
			[]string{"main b candidate - - 5s 1s ago no http://b"}},
		{"registry_unreadable", ElectionStatus{Election: "main", Self: "b", Role: "candidate", CandidatesError: "etcd down"},
			[]string{"main b candidate - - 0s never no -", "main (the other candidates are unknown: etcd down)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printStatusTable(&out, []ElectionStatus{c.in}, now); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")[1:]
			var rows []string
			for _, l := range lines {
				rows = append(rows, strings.Join(strings.Fields(l), " "))
			}
			if strings.Join(rows, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("table:\n%s\nwant rows:\n%s", out.String(), strings.Join(c.want, "\n"))
			}
		})
	}
}

func TestHistoryTable(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := HistoryStatus{Election: "main", Terms: []elector.PastTerm{
		{Token: 7, Leader: "a", Start: start, End: start.Add(90 * time.Second), Ended: elector.EndedHandedOver, Successor: "b", SuccessorToken: 9},
		{Token: 9, Leader: "b", Start: start.Add(91 * time.Second), End: start.Add(time.Hour), Ended: elector.EndedDeadlinePassed, Successor: "a", SuccessorToken: 12},
	}}
	var out bytes.Buffer
	if err := printHistoryTable(&out, h); err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		rows = append(rows, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"ELECTION TOKEN LEADER START END DURATION ENDED SUCCESSOR",
		"main 7 a 2026-01-02T03:04:05Z 2026-01-02T03:05:35Z 1m30s handed over b",
		"main 9 b 2026-01-02T03:05:36Z 2026-01-02T04:04:05Z 58m29s deadline passed a",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
}

func TestLeaderCommandRegistered(t *testing.T) {
	registered, ok := caddycmd.Commands()["leader"]
	if !ok {
		t.Fatal("caddy leader is not registered")
	}
	root := &cobra.Command{Use: "leader"}
	registered.CobraFunc(root)
	for _, c := range []struct {
		sub   string
		flags []string
	}{
		{"status", []string{"json", "address", "config", "adapter"}},
		{"history", []string{"election", "json", "address", "config", "adapter"}},
		{"resign", []string{"election", "hold-off", "address", "config", "adapter"}},
		{"transfer", []string{"to", "election", "address", "config", "adapter"}},
	} {
		t.Run(c.sub, func(t *testing.T) {
			sub, _, err := root.Find([]string{c.sub})
			if err != nil || sub.Name() != c.sub {
				t.Fatalf("caddy leader %s: %v", c.sub, err)
			}
			for _, f := range c.flags {
				if sub.Flags().Lookup(f) == nil {
					t.Errorf("caddy leader %s has no --%s", c.sub, f)
				}
			}
		})
	}
}
