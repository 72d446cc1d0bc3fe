package jobrec

import (
	"testing"
	"time"
)

func TestChecks(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second))) }
	run := func(instance string, slot, start, end float64, completed bool) Run {
		return Run{Job: "tick", Slot: at(slot), Token: 1, Instance: instance, Start: at(start), End: at(end), Completed: completed}
	}
	cases := []struct {
		name                  string
		runs                  []Run
		overlaps, twice, gaps int
	}{
		{"one after the other", []Run{run("a", 0, 0, 0.3, true), run("b", 1, 1, 1.3, true)}, 0, 0, 0},
		{"two at once on two instances", []Run{run("a", 0, 0, 0.5, true), run("b", 0, 0.4, 0.8, false)}, 1, 0, 0},
		{"a slot completed twice", []Run{run("a", 0, 0, 0.3, true), run("b", 0, 2, 2.3, true)}, 0, 1, 0},
		{"a run cut short and completed again", []Run{run("a", 0, 0, 0.3, false), run("b", 0, 2, 2.3, true)}, 0, 0, 0},
		{"slots lost", []Run{run("a", 0, 0, 0.3, true), run("b", 9, 9, 9.3, true)}, 0, 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Overlaps(tc.runs); len(got) != tc.overlaps {
				t.Errorf("Overlaps = %v, want %d", got, tc.overlaps)
			}
			if got := CompletedTwice(tc.runs); len(got) != tc.twice {
				t.Errorf("CompletedTwice = %v, want %d", got, tc.twice)
			}
			if got := Gaps(tc.runs, "tick", 5*time.Second); len(got) != tc.gaps {
				t.Errorf("Gaps = %v, want %d", got, tc.gaps)
			}
		})
	}
}
