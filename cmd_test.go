package caddyleader

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/elector/electortest"
	"github.com/caddyleader/caddy-leader/etcdbackend"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
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
		if err := leaderStatus(&out, admin, "", true); err != nil {
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
		if err := leaderStatus(&out, admin, "", false); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 3 || lines[2] != "* the instance asked" {
			t.Fatalf("status printed %d lines, want header, one row and the key to *:\n%s", len(lines), out.String())
		}
		header := strings.Fields(lines[0])
		wantHeader := []string{"ELECTION", "CANDIDATE", "ROLE", "LEADER", "TOKEN", "PRIORITY", "HOLD-OFF", "LEASE", "LEFT", "LAST", "CONTACT", "HEALTHY", "URL"}
		if strings.Join(header, " ") != strings.Join(wantHeader, " ") {
			t.Errorf("header = %q", lines[0])
		}
		row := strings.Fields(lines[1])
		token := fmt.Sprint(status(t).Token)
		if len(row) != 13 || row[0] != "cmd" || row[1] != "cmd-node" || row[2] != "*" || row[3] != "leader" || row[4] != "cmd-node" ||
			row[5] != token || row[6] != "7" || row[7] != "-" || row[10] != "ago" || row[11] != "yes" || row[12] != "http://127.0.0.1:1" {
			t.Errorf("row = %q, want cmd cmd-node * leader cmd-node %s 7 - <lease> <contact> ago yes http://127.0.0.1:1", lines[1], token)
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
			re := regexp.MustCompile("^" + want + "$")
			deadline := time.Now().Add(10 * time.Second)
			for {
				var out bytes.Buffer
				if err := leaderStatus(&out, admin, "", false); err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(out.String(), "\n") {
					if f := strings.Fields(line); len(f) > 1 && f[1] == "peer" && re.MatchString(strings.Join(f, " ")) {
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
		table := row("cmd peer follower cmd-node " + token + " 1 - - - yes http://127.0.0.1:2")
		if !strings.Contains(strings.Join(strings.Fields(table), " "), "cmd cmd-node * leader cmd-node "+token+" 7") {
			t.Errorf("the table lost this instance's row:\n%s", table)
		}
		s := status(t)
		if len(s.Candidates) != 2 || s.Candidates[0].ID != "cmd-node" || s.Candidates[0].URL != "http://127.0.0.1:1" ||
			!s.Candidates[0].Healthy || s.Candidates[0].Priority != 7 || s.Candidates[1].ID != "peer" || s.Candidates[1].Priority != 1 {
			t.Errorf("status --json candidates = %+v, want cmd-node (priority 7) and peer (1), healthy, with their URLs", s.Candidates)
		}
		// A candidate that resigns with a hold-off announces that it stays out, and stays
		// a healthy standby meanwhile, as leader_health says.
		if err := peer[0].Resign(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		row("cmd peer follower cmd-node " + token + " 1 (1m0s|[0-9]+s) - - yes http://127\\.0\\.0\\.1:2")
	})

	t.Run("transfer_to_priority_0_is_refused_with_409", func(t *testing.T) {
		backend, err := etcdbackend.New(etcdbackend.Config{Endpoints: []string{cluster.Endpoint(0)}, Prefix: "/cmd-test/"})
		if err != nil {
			t.Fatal(err)
		}
		_, never := fleet.StartCandidate(t, elector.Config{ID: "never", TTL: 2 * time.Second, Priority: elector.NeverLead, Backend: backend}, "cmd")
		waitUntil(t, "the priority-0 candidate is in the registry", func() bool {
			list, err := never[0].Candidates(t.Context())
			return err == nil && len(list) == 2
		})
		var out bytes.Buffer
		err = leaderTransfer(&out, admin, "", "never", "", false)
		want := `transfer of election "cmd": "never" has priority 0, so it never leads (HTTP 409)`
		if err == nil || err.Error() != want {
			t.Errorf("transfer --to never: err = %v, want %q", err, want)
		}
	})

	t.Run("transfer_to_an_unknown_candidate_fails_naming_it", func(t *testing.T) {
		var out bytes.Buffer
		err := leaderTransfer(&out, admin, "", "nobody", "", false)
		if err == nil || !strings.Contains(err.Error(), "nobody") || !strings.Contains(err.Error(), "(HTTP 400)") || strings.Contains(err.Error(), `\"`) {
			t.Errorf("transfer --to nobody: err = %v, output %q", err, out.String())
		}
		if s := status(t); s.Role != "leader" {
			t.Errorf("after a failed transfer the role is %s", s.Role)
		}
	})

	t.Run("transfer_needs_to", func(t *testing.T) {
		if err := leaderTransfer(new(bytes.Buffer), admin, "cmd", "", "", false); err == nil || !strings.Contains(err.Error(), "--to") {
			t.Errorf("transfer without --to: err = %v", err)
		}
	})

	t.Run("unknown_election_is_an_error", func(t *testing.T) {
		err := leaderResign(new(bytes.Buffer), admin, "other", "", "")
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
		// leaving: each successor records the term it ended, and how.
		for deadline := time.Now().Add(10 * time.Second); peer[0].Term().Token != first; {
			if time.Now().After(deadline) {
				t.Fatalf("the peer never saw term %d: %+v", first, peer[0].Term())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := leaderTransfer(new(bytes.Buffer), admin, "cmd", "peer2", "", false); err != nil {
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
				// ELECTION TOKEN LEADER START END DURATION ENDED (one or more words) SUCCESSOR
				f := strings.Fields(line)
				rows = append(rows, strings.Join(append(f[:3:3], f[6:]...), " "))
			}
			want := []string{
				fmt.Sprintf("cmd %d cmd-node transferred peer2", first),
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
		if err := leaderResign(&out, admin, "", "", "1m"); err != nil {
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
		if err := leaderStatus(new(bytes.Buffer), fmt.Sprintf("127.0.0.1:%d", freeport.MustPick(t, 1)[0]), "", false); err == nil {
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
			LeaseRemaining: 7.26, LastContact: now.Add(-1500 * time.Millisecond), Healthy: true, Priority: 1},
			[]string{"main a * leader a 42 1 - 7.3s 1.5s ago yes http://a"}},
		{"candidate_without_lease_or_leader", ElectionStatus{Election: "main", Self: "b", Role: "candidate", Priority: 1},
			[]string{"main b * candidate none - 1 - 0s never no -"}},
		{"follower_lists_the_fleet_from_the_registry", ElectionStatus{Election: "main", Self: "b", Role: "follower",
			LeaderID: "a", LeaderURL: "http://a", Token: 42, LeaseRemaining: 5, LastContact: now.Add(-time.Second), Healthy: true, Priority: 1,
			Candidates: []CandidateStatus{
				{ID: "a", URL: "http://a", Healthy: true, Priority: 1},
				{ID: "b", URL: "http://b", Healthy: true, Priority: 1},
				{ID: "c", URL: "http://c", Priority: 1, Leaving: true},
				{ID: "d", URL: "http://d", Healthy: true, Priority: 3, Preempt: true, HoldOffUntil: now.Add(20 * time.Second)},
				{ID: "e", URL: "http://e", Healthy: true},
			}},
			[]string{
				"main b * follower a 42 1 - 5s 1s ago yes http://b",
				"main a leader a 42 1 - - - yes http://a",
				"main c follower a 42 1 leaving - - no http://c",
				"main d follower a 42 3 preempt 20s - - yes http://d",
				"main e never leads a 42 0 - - - yes http://e",
			}},
		{"held_off_after_resign_is_healthy", ElectionStatus{Election: "main", Self: "b", Role: "follower", LeaderID: "a", Token: 43,
			LeaseRemaining: 5, LastContact: now.Add(-time.Second), Healthy: true, Priority: 1, HoldOff: 19.6,
			Candidates: []CandidateStatus{{ID: "b", URL: "http://b", Healthy: true, Priority: 1, HoldOffUntil: now.Add(20 * time.Second)}}},
			[]string{"main b * follower a 43 1 20s 5s 1s ago yes http://b"}},
		{"priority_0_never_leads", ElectionStatus{Election: "main", Self: "z", Role: "candidate",
			LeaseRemaining: 5, LastContact: now.Add(-time.Second), Healthy: true, Priority: 0},
			[]string{"main z * never leads none - 0 - 5s 1s ago yes -"}},
		{"leaving_is_unhealthy", ElectionStatus{Election: "main", Self: "b", Role: "candidate", Priority: 1, Leaving: true,
			LeaseRemaining: 5, LastContact: now.Add(-time.Second)},
			[]string{"main b * candidate none - 1 leaving 5s 1s ago no -"}},
		{"registry_unreadable", ElectionStatus{Election: "main", Self: "b", Role: "candidate", Priority: 1, CandidatesError: "etcd down"},
			[]string{"main b * candidate none - 1 - 0s never no -", "main (the other candidates are unknown: etcd down)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printStatusTable(&out, []ElectionStatus{c.in}, now); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
			if lines[len(lines)-1] != "* the instance asked" {
				t.Errorf("the table does not end with the key to the * mark:\n%s", out.String())
			}
			var rows []string
			for _, l := range lines[1 : len(lines)-1] {
				rows = append(rows, strings.Join(strings.Fields(l), " "))
			}
			if strings.Join(rows, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("table:\n%s\nwant rows:\n%s", out.String(), strings.Join(c.want, "\n"))
			}
		})
	}
}

// TestPlainAdminError: the CLI prints the admin API's sentence and status, not its JSON.
func TestPlainAdminError(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"api_error", `caddy responded with error: HTTP 409: {"error":"transfer of election \"main\": \"b\" has priority 0, so it never leads"}`,
			`transfer of election "main": "b" has priority 0, so it never leads (HTTP 409)`},
		{"not_json", `caddy responded with error: HTTP 500: oops`, `oops (HTTP 500)`},
		{"no_answer", `performing request: dial tcp 127.0.0.1:1: connect: connection refused`,
			`the admin API did not answer: performing request: dial tcp 127.0.0.1:1: connect: connection refused`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := plainAdminError(errors.New(c.in)).Error(); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestHistoryTable(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := HistoryStatus{Election: "main", Terms: []elector.PastTerm{
		{Token: 7, Leader: "a", Start: start, End: start.Add(90 * time.Second), Ended: elector.EndedHandedOver, Successor: "b", SuccessorToken: 9},
		{Token: 9, Leader: "b", Start: start.Add(91 * time.Second), End: start.Add(time.Hour), Ended: elector.EndedCrashed, Successor: "a", SuccessorToken: 12},
		{Token: 12, Leader: "a", Start: start.Add(time.Hour), End: start.Add(2 * time.Hour), Ended: elector.EndedTransferred, Successor: "c", SuccessorToken: 13},
		{Token: 13, Leader: "c", Start: start.Add(2 * time.Hour), End: start.Add(3 * time.Hour), Ended: elector.EndedDeadlineMissed, Successor: "a", SuccessorToken: 15},
		// A term its successor never saw (it started after its leader stopped): the store
		// named only its token.
		{Token: 15, End: start.Add(4 * time.Hour), Ended: elector.EndedHandedOver, Successor: "b", SuccessorToken: 16},
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
		"main 9 b 2026-01-02T03:05:36Z 2026-01-02T04:04:05Z 58m29s crashed a",
		"main 12 a 2026-01-02T04:04:05Z 2026-01-02T05:04:05Z 1h0m0s transferred c",
		"main 13 c 2026-01-02T05:04:05Z 2026-01-02T06:04:05Z 1h0m0s deadline missed a",
		"main 15 unknown unknown 2026-01-02T07:04:05Z unknown handed over b",
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
		{"status", []string{"election", "json", "address", "config", "adapter"}},
		{"history", []string{"election", "json", "address", "config", "adapter"}},
		{"resign", []string{"election", "hold-off", "address", "config", "adapter"}},
		{"transfer", []string{"to", "election", "timeout", "address", "config", "adapter"}},
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

// TestPreemptedTransfer: a transfer that a preempting candidate of higher priority will undo
// says so.
func TestPreemptedTransfer(t *testing.T) {
	until := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		name string
		list []elector.CandidateInfo
		want string
	}{
		{"no_preempt", []elector.CandidateInfo{{ID: "a", Priority: 5}, {ID: "b", Priority: 1}}, ""},
		{"preempt_below_the_target", []elector.CandidateInfo{{ID: "a", Priority: 1, Preempt: true}, {ID: "b", Priority: 5}}, ""},
		{"preempt_leaving", []elector.CandidateInfo{{ID: "a", Priority: 5, Preempt: true, Leaving: true}, {ID: "b", Priority: 1}}, ""},
		{"preempt_above_the_target", []elector.CandidateInfo{{ID: "a", Priority: 5, Preempt: true}, {ID: "b", Priority: 1}},
			"a has priority 5 and preempt, above b's 1: it will take leadership back at once"},
		{"preempt_held_off", []elector.CandidateInfo{{ID: "a", Priority: 5, Preempt: true, HoldOffUntil: until}, {ID: "b", Priority: 1}},
			"a has priority 5 and preempt, above b's 1: it will take leadership back when its hold-off ends at 2026-01-02T03:04:05Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := preemptedTransfer(c.list, "b"); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// leaderRoot is the `caddy leader` command tree as Caddy builds it, its errors written to errs.
func leaderRoot(t *testing.T, errs *bytes.Buffer) *cobra.Command {
	t.Helper()
	root := &cobra.Command{Use: "caddy", SilenceUsage: true}
	leader := &cobra.Command{Use: "leader"}
	caddycmd.Commands()["leader"].CobraFunc(leader)
	root.AddCommand(leader)
	root.SetErr(errs)
	root.SetOut(new(bytes.Buffer))
	return root
}

// TestLeaderCommandMisuse: a flag, argument or subcommand that `caddy leader` does not know
// gets an error that names it (cobra's, printed as `caddy reload --bogus` prints it), and
// the flags every subcommand takes are accepted. No admin API is needed: each case fails
// before any request, or succeeds at parsing and fails on the closed admin port.
func TestLeaderCommandMisuse(t *testing.T) {
	closed := fmt.Sprintf("127.0.0.1:%d", freeport.MustPick(t, 1)[0])
	for _, c := range []struct {
		name string
		args []string
		want string // in the printed error; "" for a parse that must succeed
	}{
		{"unknown_flag_is_named", []string{"status", "--bogus"}, "unknown flag: --bogus (see 'caddy leader status --help')"},
		{"extra_argument_is_named", []string{"resign", "extra"}, `unknown command "extra" for "caddy leader resign"`},
		{"unknown_subcommand_is_named_not_its_flags", []string{"frobnicate", "--address", "X"}, `unknown subcommand "frobnicate" for "caddy leader": use status, shards, history, resign, transfer or jobs`},
		{"status_takes_election", []string{"status", "--election", "default", "--address", closed}, ""},
		{"jobs_run_needs_the_job", []string{"jobs", "run", "--address", closed}, "accepts 1 arg(s), received 0"},
		{"jobs_run_takes_shard", []string{"jobs", "run", "compact", "--shard", "3", "--address", closed}, ""},
		{"jobs_takes_json", []string{"jobs", "--json", "--address", closed}, ""},
		{"history_takes_election", []string{"history", "--election", "default", "--address", closed}, ""},
		{"resign_takes_election", []string{"resign", "--election", "default", "--address", closed}, ""},
		{"transfer_takes_timeout", []string{"transfer", "--to", "a", "--timeout", "5s", "--election", "default", "--address", closed}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var errs bytes.Buffer
			root := leaderRoot(t, &errs)
			root.SetArgs(append([]string{"leader"}, c.args...))
			_, err := root.ExecuteC()
			if c.want == "" {
				// Parsed: the command ran and failed on the closed port, saying so itself.
				if !strings.Contains(errs.String(), "the admin API did not answer") {
					t.Errorf("%v: want it parsed, then refused by the closed admin port; printed %q", c.args, errs.String())
				}
				return
			}
			if err == nil || !strings.Contains(errs.String(), c.want) {
				t.Errorf("%v: error %v, printed %q; want it to print %q", c.args, err, errs.String(), c.want)
			}
		})
	}
}

// TestLeaderCommandAnswers covers what the command says about its input and about answers
// that are not what it expects, against a stand-in for the admin API (or a site's port).
func TestLeaderCommandAnswers(t *testing.T) {
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<!DOCTYPE html>\n<html><body>my site</body></html>")
	}))
	t.Cleanup(site.Close)
	emptyHistory := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"election":"default","terms":[]}`)
	}))
	t.Cleanup(emptyHistory.Close)
	siteAddr := strings.TrimPrefix(site.URL, "http://")

	for _, c := range []struct {
		name    string
		run     func(out *bytes.Buffer) error
		wantErr string
		wantOut string
	}{
		{"hold_off_without_unit", func(out *bytes.Buffer) error { return leaderResign(out, siteAddr, "default", "", "5") },
			`--hold-off: "5" has no unit: write 5s, 5m or 5h`, ""},
		{"hold_off_not_a_duration", func(out *bytes.Buffer) error { return leaderResign(out, siteAddr, "default", "", "soon") },
			`--hold-off: "soon" is not a non-negative duration`, ""},
		{"timeout_without_unit", func(out *bytes.Buffer) error { return leaderTransfer(out, siteAddr, "default", "a", "20", false) },
			`--timeout: "20" has no unit`, ""},
		{"a_site_port_is_not_the_admin_api", func(out *bytes.Buffer) error { return leaderStatus(out, siteAddr, "", false) },
			"answered HTTP 200 with text/html; charset=utf-8 (\"<!DOCTYPE html> <html><body>my site</body></html>\"), not the admin API's JSON: is it the admin address", ""},
		{"empty_history_says_so", func(out *bytes.Buffer) error {
			return leaderHistory(out, strings.TrimPrefix(emptyHistory.URL, "http://"), "default", false)
		}, "", "election default: no term has ended yet"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			err := c.run(&out)
			switch {
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("error %v, want one containing %q", err, c.wantErr)
			case c.wantErr == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case !strings.Contains(out.String(), c.wantOut):
				t.Errorf("printed %q, want %q", out.String(), c.wantOut)
			}
		})
	}
}

func TestAdminAddress(t *testing.T) {
	for _, c := range []struct{ in, want, wantErr string }{
		{"127.0.0.1:2019", "127.0.0.1:2019", ""},
		{"http://127.0.0.1:2019", "127.0.0.1:2019", ""},
		{"http://localhost:2020/", "localhost:2020", ""},
		{"https://localhost:2019", "", "the admin API answers plain HTTP"},
		{"http://localhost:2019/leader/", "", "give the admin API's host:port"},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := adminAddress(c.in, "", "")
			switch {
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("error %v, want one containing %q", err, c.wantErr)
			case c.wantErr == "" && (err != nil || got != c.want):
				t.Errorf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// TestResignWithoutStoreNamesIt: a resign asked while this instance cannot reach its store
// says so, instead of only that no leader is known.
func TestResignWithoutStoreNamesIt(t *testing.T) {
	store := electortest.NewStore()
	a := memoryCandidate(t, store, "a", 1)
	waitUntil(t, "a is healthy", a.Healthy)
	if got := storeTrouble(a); got != "" {
		t.Errorf("with the store answering: %q, want nothing", got)
	}
	store.SetDown(errors.New("frozen"))
	waitUntil(t, "a's lease runs out", func() bool { return !a.Healthy() })
	if got := storeTrouble(a); !strings.Contains(got, "cannot reach its store") || !strings.Contains(got, "its last answer came") {
		t.Errorf("with the store down: %q, want it to say that the store cannot be reached and since when", got)
	}
}
