package statuspage

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyleader/caddy-leader/jobs"
)

// jobView is a scheduled job as the page's Jobs section shows it: one row, however many
// shards it runs on (a set's job is summed up over its shards).
type jobView struct {
	Name, Schedule, Request string
	// Under is "election <name>" or "shard set <name>".
	Under string
	// Runs says who runs the job's slots now, as this instance sees it.
	Runs string
	// Running is the run in progress on this instance; empty when none.
	Running string
	// Started and Finished are the slot last started and the slot last finished, by whom
	// and how; "–" when none. A set's are the latest among its shards.
	Started, Finished string
	// Results counts the last result of each shard, for a set's job ("ok ×12, failed ×1");
	// empty for an election's.
	Results string
	// Failed is set when the last finished run (of any shard) did not end ok.
	Failed bool
	// Next is the next slot, Missed the slots missed since the record began (summed over
	// a set's shards).
	Next   string
	Missed int64
}

// slotTime is how the page writes a slot and a run's times: with the day, since a cron
// job's slots may be days apart.
const slotTime = "Jan 2 15:04:05"

func newJobView(j jobs.Listing, s Snapshot) jobView {
	v := jobView{Name: j.Job, Schedule: j.Schedule, Request: j.Request, Started: "–", Finished: "–", Next: "–"}
	var started, finished *jobs.Mark
	results := map[string]int{}
	leading := 0
	var next time.Time
	for _, lead := range j.Leads {
		if lead.Leading {
			leading++
		}
		if lead.Running != nil && v.Running == "" {
			v.Running = fmt.Sprintf("slot %s, attempt %d, token %d", lead.Running.Slot.UTC().Format(slotTime), lead.Running.Attempt, lead.Running.Token)
		}
		if !lead.Next.IsZero() && (next.IsZero() || lead.Next.Before(next)) {
			next = lead.Next
		}
		if lead.Record == nil {
			continue
		}
		v.Missed += lead.Record.MissedSlots
		if m := lead.Record.Started; m != nil && (started == nil || m.At.After(started.At)) {
			started = m
		}
		if m := lead.Record.Finished; m != nil {
			results[m.Result]++
			if finished == nil || m.At.After(finished.At) {
				finished = m
			}
		}
	}
	if started != nil {
		v.Started = fmt.Sprintf("slot %s by %s (token %d)", started.Slot.UTC().Format(slotTime), started.By, started.Token)
	}
	if finished != nil {
		v.Finished = fmt.Sprintf("slot %s by %s: %s in %s", finished.Slot.UTC().Format(slotTime), finished.By, finished.Result, roundDuration(finished.Took))
		if finished.Error != "" {
			v.Finished += ": " + finished.Error
		}
		v.Failed = finished.Result != jobs.ResultOK
	}
	if !next.IsZero() {
		v.Next = next.UTC().Format(slotTime)
	}
	if j.ShardSet != "" {
		v.Under = "shard set " + j.ShardSet
		v.Runs = fmt.Sprintf("each shard's owner: this instance for the %d of %d shards it owns", leading, len(j.Leads))
		var counted []string
		for _, result := range slices.Sorted(maps.Keys(results)) {
			counted = append(counted, result+" ×"+strconv.Itoa(results[result]))
		}
		v.Results = strings.Join(counted, ", ")
		return v
	}
	v.Under = "election " + j.Election
	switch {
	case leading > 0:
		v.Runs = "this instance (it leads)"
	case leaderOf(s, j.Election) != "":
		v.Runs = leaderOf(s, j.Election) + ", its leader"
	default:
		v.Runs = "nobody: the election has no leader"
	}
	return v
}

// leaderOf is the leader of the snapshot's election name, as this instance sees it; empty
// when none is known (or the page does not show the election).
func leaderOf(s Snapshot, name string) string {
	for _, el := range s.Elections {
		if el.Election.Election == name {
			return el.LeaderID
		}
	}
	return ""
}

// jobState sums up what this instance knows of job j's runs without asking the store: when
// it changes, the page is due for a new snapshot.
func jobState(j jobs.Listing) string {
	line := []string{"\x00job", j.Job, j.Election, j.ShardSet}
	for _, lead := range j.Leads {
		line = append(line, boolText(lead.Leading), lead.Next.String())
		if lead.Running != nil {
			line = append(line, "running", lead.Running.Slot.String(), strconv.Itoa(lead.Running.Attempt))
		}
		if r := lead.Record; r != nil {
			for _, m := range []*jobs.Mark{r.Started, r.Finished, r.Manual} {
				if m != nil {
					line = append(line, m.Slot.String(), cmp.Or(m.Result, "-"), m.At.String())
				}
			}
			line = append(line, strconv.FormatInt(r.MissedSlots, 10))
		}
	}
	return strings.Join(line, "\x00")
}
