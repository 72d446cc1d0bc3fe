package caddyleader

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/freeport"
	"github.com/caddyleader/caddy-leader/shards"
)

// TestShardCommands runs `caddy leader shards`, `status` and `resign --shards` against the
// admin API of a Caddy started in this process, the one candidate of a shard set of 8 on a
// real etcd: it owns every shard.
func TestShardCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	admin := fmt.Sprintf("127.0.0.1:%d", freeport.MustPick(t, 1)[0])
	config := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"apps": {"leader": {"endpoints": [%q], "prefix": "/shard-cmd-test/", "ttl": "2s",
			"instance_id": "shard-node", "advertise": "http://127.0.0.1:1",
			"shard_sets": {"rooms": {"shards": 8}}}}}`, admin, cluster.Endpoint(0))
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	shards := func(t *testing.T) ShardSetStatus {
		t.Helper()
		var out bytes.Buffer
		if err := leaderShards(&out, admin, "", true); err != nil {
			t.Fatal(err)
		}
		var st ShardSetStatus
		if err := json.Unmarshal(out.Bytes(), &st); err != nil {
			t.Fatalf("shards --json printed %q: %v", out.String(), err)
		}
		return st
	}
	// Waiting for the campaigns is not a timing assertion: the test asserts what the
	// commands show once the instance owns every shard.
	settled := func(st ShardSetStatus) bool {
		return st.Owners["shard-node"] == 8 && st.Moving == 0 && len(st.Candidates) == 1
	}
	for deadline := time.Now().Add(15 * time.Second); !settled(shards(t)); {
		if time.Now().After(deadline) {
			t.Fatalf("the only candidate does not own every shard: %+v", shards(t))
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("shards_lists_every_shard_with_its_owner_and_token", func(t *testing.T) {
		st := shards(t)
		if st.Set != "rooms" || st.Shards != 8 || len(st.List) != 8 || st.Leaderless != 0 {
			t.Fatalf("shards --json = %+v", st)
		}
		for s, sh := range st.List {
			if sh.Shard != s || sh.Election != fmt.Sprintf("rooms.%d", s) || sh.Owner != "shard-node" || sh.Preferred != "shard-node" || sh.Token <= 0 {
				t.Errorf("shard %d = %+v", s, sh)
			}
		}
		var out bytes.Buffer
		if err := leaderShards(&out, admin, "rooms", false); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "rooms.7") || !strings.Contains(out.String(), "shard-node *") {
			t.Errorf("the shards table lacks a shard or this instance:\n%s", out.String())
		}
	})

	t.Run("status_sums_the_set_and_lists_no_shard_election", func(t *testing.T) {
		var out bytes.Buffer
		if err := leaderStatus(&out, admin, "", false); err != nil {
			t.Fatal(err)
		}
		table := out.String()
		if !strings.Contains(table, "SHARD SET") || !regexp.MustCompile(`rooms\s+8\s+0\s+0\s+shard-node \*\s+8\s+8`).MatchString(table) {
			t.Errorf("status does not sum the set:\n%s", table)
		}
		if strings.Contains(table, "rooms.3") {
			t.Errorf("status lists a shard's election:\n%s", table)
		}
		err := leaderStatus(&out, admin, "rooms.3", false)
		if err == nil || !strings.Contains(err.Error(), "caddy leader shards rooms") {
			t.Errorf("status --election rooms.3: %v", err)
		}
	})

	t.Run("resign_shards_hands_over_every_shard_it_owns", func(t *testing.T) {
		before := shards(t)
		var out bytes.Buffer
		if err := leaderResign(&out, admin, "", "rooms", "1s"); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "resigned 8 shards of set rooms") {
			t.Errorf("resign --shards printed %q", out.String())
		}
		// With nobody else to take them, it takes them back after the hold-off, each under
		// a new term.
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			after := shards(t)
			newTerms := 0
			for s := range after.List {
				if after.List[s].Owner == "shard-node" && after.List[s].Token > before.List[s].Token {
					newTerms++
				}
			}
			if newTerms == 8 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after resign --shards and its hold-off, %d of 8 shards have a new term: %+v", newTerms, after.List)
			}
		}
	})

	t.Run("an_unknown_set_is_named", func(t *testing.T) {
		err := leaderShards(new(bytes.Buffer), admin, "tenants", false)
		if err == nil || !strings.Contains(err.Error(), `"tenants"`) {
			t.Errorf("shards tenants: %v", err)
		}
	})
}

// TestShardOperations runs the shard operations that placement would undo against a Caddy
// instance (shard-a, with the admin API) and a peer candidate (shard-b) in this process,
// sharing a set of 8 shards on a real etcd: a transfer to an instance that placement does
// not prefer is refused, and resign --shards holds the instance off the whole set, so that
// the set reads as settled on the others during the hold-off.
func TestShardOperations(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and Caddy")
	}
	cluster := etcdtest.Start(t, 1)
	const prefix, count = "/shard-ops-test/", 8
	_, peer := startShardPeer(t, cluster, prefix, "shard-b", count)
	admin := fmt.Sprintf("127.0.0.1:%d", freeport.MustPick(t, 1)[0])
	config := fmt.Sprintf(`{
		"admin": {"listen": %q},
		"apps": {"leader": {"endpoints": [%q], "prefix": %q, "ttl": "2s",
			"instance_id": "shard-a", "advertise": "http://127.0.0.1:1",
			"shard_sets": {"rooms": {"shards": %d}}}}}`, admin, cluster.Endpoint(0), prefix, count)
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	owners := shards.Placement(count, []shards.Candidate{{ID: "shard-a", Weight: 1}, {ID: "shard-b", Weight: 1}})
	ofA := slices.Index(owners, "shard-a")
	if ofA < 0 || !slices.Contains(owners, "shard-b") {
		t.Fatalf("placement %v gives one instance every shard: the test needs both", owners)
	}
	status := func() ShardSetStatus {
		var st ShardSetStatus
		if err := adminCall(admin, http.MethodGet, "/leader/shards/rooms", &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// Waiting for the placement is not a timing assertion: the test asserts what the
	// commands do once every shard is at its preferred owner.
	waitUntil(t, "every shard is at its preferred owner", func() bool {
		st := status()
		return st.Moving == 0 && st.Leaderless == 0 && st.Owners["shard-a"]+st.Owners["shard-b"] == count && len(st.Candidates) == 2
	})

	t.Run("transfer_of_a_shard_away_from_its_preferred_owner_is_refused", func(t *testing.T) {
		election := fmt.Sprintf("rooms.%d", ofA)
		token := status().List[ofA].Token
		err := leaderTransfer(new(bytes.Buffer), admin, election, "shard-b", "", false)
		if err == nil || !strings.Contains(err.Error(), "placement prefers shard-a") || !strings.Contains(err.Error(), "caddy leader resign --shards rooms") {
			t.Fatalf("transfer --election %s --to shard-b: %v", election, err)
		}
		if sh := status().List[ofA]; sh.Owner != "shard-a" || sh.Token != token {
			t.Errorf("after the refused transfer, shard %d = %+v (token %d before)", ofA, sh, token)
		}
		// --force moves it all the same; placement then brings it back.
		var out bytes.Buffer
		if err := leaderTransfer(&out, admin, election, "shard-b", "", true); err != nil || !strings.Contains(out.String(), "shard-b leads now") {
			t.Fatalf("transfer --force --election %s --to shard-b: %v (%s)", election, err, out.String())
		}
		waitUntil(t, "placement brings the forced shard back", func() bool {
			st := status()
			return st.Moving == 0 && st.List[ofA].Owner == "shard-a"
		})
	})

	t.Run("resign_shards_holds_the_instance_off_every_shard_of_the_set", func(t *testing.T) {
		if err := leaderResign(new(bytes.Buffer), admin, "", "rooms", "30s"); err != nil {
			t.Fatal(err)
		}
		heldOffEverywhere := func() bool {
			for _, e := range peer {
				list, err := e.KnownCandidates(t.Context())
				if err != nil {
					return false
				}
				for _, c := range list {
					if c.ID == "shard-a" && c.Healthy {
						return false
					}
				}
			}
			return true
		}
		waitUntil(t, "every shard's registry lists shard-a as held off", heldOffEverywhere)
		waitUntil(t, "shard-b owns every shard and the set reads as settled", func() bool {
			st := status()
			return st.Owners["shard-b"] == count && st.Moving == 0
		})
	})
}
