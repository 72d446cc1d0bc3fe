package shards

import (
	"fmt"
	"hash/fnv"
	"math"
	"testing"
)

// The test vector users check their own code against (docs/shards.md quotes it); each hash
// is also checked against the standard library's FNV-1a.
func TestOfVector(t *testing.T) {
	for _, tc := range []struct {
		key           string
		hash          uint64
		of256, of4096 int
	}{
		{"", 0xcbf29ce484222325, 37, 805},
		{"a", 0xaf63dc4c8601ec8c, 140, 3212},
		{"room-42", 0xb57038d1b56f17b3, 179, 1971},
		{"tenant/acme", 0x679c55f8c9742f00, 0, 3840},
	} {
		t.Run(fmt.Sprintf("%q", tc.key), func(t *testing.T) {
			std := fnv.New64a()
			std.Write([]byte(tc.key))
			if got := Hash(tc.key); got != tc.hash || got != std.Sum64() {
				t.Fatalf("Hash(%q) = %#x, want %#x (hash/fnv: %#x)", tc.key, got, tc.hash, std.Sum64())
			}
			if got := Of(tc.key, 256); got != tc.of256 {
				t.Errorf("Of(%q, 256) = %d, want %d", tc.key, got, tc.of256)
			}
			if got := Of(tc.key, 4096); got != tc.of4096 {
				t.Errorf("Of(%q, 4096) = %d, want %d", tc.key, got, tc.of4096)
			}
		})
	}
}

// Placement must not change between releases either: a fleet that runs two releases side by
// side during an upgrade would otherwise move shards back and forth.
func TestOwnerVector(t *testing.T) {
	want := []string{"node-3", "node-1", "node-1", "node-3"}
	for shard, owner := range want {
		if got := Owner(shard, fleet(3)); got != owner {
			t.Errorf("Owner(%d, node-1..3) = %s, want %s", shard, got, owner)
		}
	}
}

func fleet(n int) []Candidate {
	c := make([]Candidate, n)
	for i := range c {
		c[i] = Candidate{ID: fmt.Sprintf("node-%d", i+1), Weight: 1}
	}
	return c
}

func counts(owners []string) map[string]int {
	m := map[string]int{}
	for _, o := range owners {
		m[o]++
	}
	return m
}

func TestPlacementBalance(t *testing.T) {
	for _, tc := range []struct {
		shards, instances int
		tolerance         float64
	}{
		{4096, 5, 0.10},
		{4096, 3, 0.10},
		{256, 3, 0.25},
	} {
		t.Run(fmt.Sprintf("%d shards on %d instances", tc.shards, tc.instances), func(t *testing.T) {
			got := counts(Placement(tc.shards, fleet(tc.instances)))
			fair := float64(tc.shards) / float64(tc.instances)
			for id, n := range got {
				if math.Abs(float64(n)-fair) > tc.tolerance*fair {
					t.Errorf("%s owns %d shards; fair is %.0f ± %.0f%%", id, n, fair, 100*tc.tolerance)
				}
			}
			if len(got) != tc.instances {
				t.Errorf("%d instances own shards, want %d: %v", len(got), tc.instances, got)
			}
		})
	}
}

func TestJoinAndLeaveMoveOnlyTheirShare(t *testing.T) {
	const n = 4096
	five := fleet(5)
	six := append(fleet(5), Candidate{ID: "node-6", Weight: 1})
	before, after := Placement(n, five), Placement(n, six)
	moved := 0
	for s := range before {
		if before[s] != after[s] {
			moved++
			if after[s] != "node-6" {
				t.Fatalf("shard %d moved from %s to %s, not to the instance that joined", s, before[s], after[s])
			}
		}
	}
	if share := float64(moved) / n; math.Abs(share-1.0/6) > 0.02 {
		t.Errorf("a join moved %d of %d shards (%.3f), want about 1/6", moved, n, share)
	}
	// Leaving is the same move backwards: only node-6's shards move.
	for s := range after {
		if after[s] != "node-6" && after[s] != before[s] {
			t.Fatalf("shard %d: %s -> %s although node-6 was not its owner", s, after[s], before[s])
		}
	}
}

func TestPriorityWeighsThePlacement(t *testing.T) {
	c := []Candidate{{"a", 1}, {"b", 2}, {"never", 0}}
	got := counts(Placement(4096, c))
	if got["never"] != 0 {
		t.Errorf("a candidate of priority 0 owns %d shards", got["never"])
	}
	if ratio := float64(got["b"]) / float64(got["a"]); ratio < 1.8 || ratio > 2.2 {
		t.Errorf("priority 2 owns %d shards, priority 1 %d: ratio %.2f, want about 2", got["b"], got["a"], ratio)
	}
	if Owner(0, []Candidate{{"never", 0}}) != "" {
		t.Error("a shard has an owner although no candidate may own one")
	}
}

func BenchmarkOf(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Of("room-42", 4096)
	}
}

func BenchmarkPlacement4096On5(b *testing.B) {
	c := fleet(5)
	for i := 0; i < b.N; i++ {
		Placement(4096, c)
	}
}
