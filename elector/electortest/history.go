package electortest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// history checks the store's history of terms: appends keep their order, the oldest go
// beyond keep, every client reads the same list, it outlives the lease of the client that
// wrote it, concurrent appends all land, and elections keep separate histories.
func history(t *testing.T, h *harness) {
	a, la, _ := h.client()
	b, _, _ := h.client()
	read := func() string {
		t.Helper()
		entries, err := b.History(h.ctx(), h.election)
		if err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(entries))
		for i, e := range entries {
			parts[i] = string(e)
		}
		return strings.Join(parts, " ")
	}
	if got := read(); got != "" {
		t.Fatalf("History of a new election = %q, want none", got)
	}
	for i := 1; i <= 5; i++ {
		if err := a.AppendHistory(h.ctx(), h.election, []byte(fmt.Sprint("t", i)), 3); err != nil {
			t.Fatalf("AppendHistory t%d: %v", i, err)
		}
	}
	if got := read(); got != "t3 t4 t5" {
		t.Fatalf("after five appends keeping three, History = %q, want t3 t4 t5", got)
	}
	if err := a.Revoke(h.ctx(), la); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "t3 t4 t5" {
		t.Fatalf("after the writer's lease was revoked History = %q, want it unchanged", got)
	}
	var wg sync.WaitGroup
	for _, c := range []string{"x", "y"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.AppendHistory(h.ctx(), h.election, []byte(c), 10); err != nil {
				t.Errorf("concurrent AppendHistory %s: %v", c, err)
			}
		}()
	}
	wg.Wait()
	if got := read(); got != "t3 t4 t5 x y" && got != "t3 t4 t5 y x" {
		t.Fatalf("after two concurrent appends History = %q, want both after t5", got)
	}
	other := h.Election()
	if entries, err := b.History(h.ctx(), other); err != nil || len(entries) != 0 {
		t.Fatalf("History of another election = %q, %v; want none", entries, err)
	}
}
