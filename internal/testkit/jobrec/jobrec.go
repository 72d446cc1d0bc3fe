// Package jobrec is a service for scheduled jobs that records every run it receives, and
// the checks of what a fleet promises about those runs.
package jobrec

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Run is one request of a job's run as the service received it.
type Run struct {
	Job      string
	Slot     time.Time
	Token    int64
	Instance string
	// Start is when the request arrived, End when the service was done with it: it
	// answered, or the client went away.
	Start, End time.Time
	// Completed is set when the service did the whole run and answered; a run whose
	// client went away first is not completed.
	Completed bool
}

// Service records runs. Each run takes Hold (unless its client goes away first).
type Service struct {
	*httptest.Server
	// Hold is how long the service works on a run.
	Hold time.Duration

	mu      sync.Mutex
	runs    []Run
	running []int // indexes of the runs under way
	changed chan struct{}
}

// Start starts a service on 127.0.0.1; it is closed when t ends.
func Start(t interface{ Cleanup(func()) }, hold time.Duration) *Service {
	s := &Service{Hold: hold, changed: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *Service) serve(w http.ResponseWriter, r *http.Request) {
	slot, err := time.Parse(time.RFC3339Nano, r.Header.Get("Leader-Job-Slot"))
	token, err2 := strconv.ParseInt(r.Header.Get("Leader-Token"), 10, 64)
	if err != nil || err2 != nil {
		http.Error(w, "no Leader-Job-Slot or Leader-Token header", http.StatusBadRequest)
		return
	}
	run := Run{Job: r.Header.Get("Leader-Job"), Slot: slot, Token: token, Instance: r.Header.Get("Leader-Instance"), Start: time.Now()}
	s.mu.Lock()
	i := len(s.runs)
	s.runs = append(s.runs, run)
	s.wakeLocked()
	s.mu.Unlock()

	done := false
	select {
	case <-time.After(s.Hold):
		done = true
	case <-r.Context().Done():
	}
	s.mu.Lock()
	s.runs[i].End, s.runs[i].Completed = time.Now(), done
	s.wakeLocked()
	s.mu.Unlock()
	if done {
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Service) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Runs returns the runs so far, in the order they arrived.
func (s *Service) Runs() []Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Run(nil), s.runs...)
}

// Await waits until cond holds for the runs so far, or within passes (false).
func (s *Service) Await(within time.Duration, cond func(runs []Run) bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, changed := cond(s.runs), s.changed
		s.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

// Under returns the run under way on instance, if any.
func Under(runs []Run, instance string) (Run, bool) {
	for _, r := range runs {
		if r.Instance == instance && r.End.IsZero() {
			return r, true
		}
	}
	return Run{}, false
}

// Overlaps lists every two runs of one job that were under way at once, by the
// service's clock (a run not yet ended counts as under way until now).
func Overlaps(runs []Run) []string {
	var found []string
	now := time.Now()
	end := func(r Run) time.Time {
		if r.End.IsZero() {
			return now
		}
		return r.End
	}
	for i, a := range runs {
		for _, b := range runs[i+1:] {
			if a.Job == b.Job && a.Start.Before(end(b)) && b.Start.Before(end(a)) {
				found = append(found, fmt.Sprintf("%s: slot %s on %s (token %d, %s to %s) and slot %s on %s (token %d, %s to %s)",
					a.Job, a.Slot.Format(time.TimeOnly), a.Instance, a.Token, a.Start.Format(time.StampMicro), end(a).Format(time.StampMicro),
					b.Slot.Format(time.TimeOnly), b.Instance, b.Token, b.Start.Format(time.StampMicro), end(b).Format(time.StampMicro)))
			}
		}
	}
	return found
}

// CompletedTwice lists the slots of a job that were completed more than once.
func CompletedTwice(runs []Run) []string {
	count := make(map[string][]Run)
	for _, r := range runs {
		if r.Completed {
			k := r.Job + " " + r.Slot.Format(time.RFC3339Nano)
			count[k] = append(count[k], r)
		}
	}
	var found []string
	for k, rs := range count {
		if len(rs) > 1 {
			s := k + ":"
			for _, r := range rs {
				s += fmt.Sprintf(" %s (token %d)", r.Instance, r.Token)
			}
			found = append(found, s)
		}
	}
	sort.Strings(found)
	return found
}

// Gaps lists the stretches longer than most between two slots of a job that were
// completed one after the other, from its first completed slot on: slots no run covered.
func Gaps(runs []Run, job string, most time.Duration) []string {
	var slots []time.Time
	for _, r := range runs {
		if r.Job == job && r.Completed {
			slots = append(slots, r.Slot)
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	var found []string
	for i := 1; i < len(slots); i++ {
		if d := slots[i].Sub(slots[i-1]); d > most {
			found = append(found, fmt.Sprintf("%s: no slot completed between %s and %s (%s)", job,
				slots[i-1].Format(time.TimeOnly), slots[i].Format(time.TimeOnly), d))
		}
	}
	return found
}

// Lateness is how long after its slot each run reached the service.
func Lateness(runs []Run) []time.Duration {
	out := make([]time.Duration, len(runs))
	for i, r := range runs {
		out[i] = r.Start.Sub(r.Slot)
	}
	return out
}
