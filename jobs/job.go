package jobs

import (
	"context"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// What a job does with the slots it missed while nobody led (Spec.Missed).
const (
	// MissedRunOnce runs the newest missed slot once, as soon as a term can, standing for
	// all of them (Run.Missed counts the others). The default.
	MissedRunOnce = "run_once"
	// MissedSkip counts the missed slots and waits for the next one.
	MissedSkip = "skip"
)

// What a job does when a slot comes while its run of an earlier slot still runs
// (Spec.Overlap). One job never has two runs at once, on one instance or across the fleet.
const (
	// OverlapSkip counts the slot as missed and waits for the next one. The default.
	OverlapSkip = "skip"
	// OverlapWait runs the newest such slot as soon as the earlier run ends.
	OverlapWait = "wait"
)

// Results of a run, as recorded and counted.
const (
	ResultOK      = "ok"      // the action succeeded
	ResultFailed  = "failed"  // every attempt failed (the last error is recorded)
	ResultTimeout = "timeout" // the last attempt ran out of Spec.Timeout
	// ResultCancelled: the term stopped admitting during the run (its deadline, a resign,
	// a handover after its drain, a lost key): the slot is not finished, and the next term
	// runs it again.
	ResultCancelled = "cancelled"
)

// Why slots were missed (Events.Missed).
const (
	MissedNoLeader = "no leader" // due while no term of this job's election admitted
	MissedOverlap  = "overlap"   // due while a run of an earlier slot still ran
)

// Spec is one job: what to run, when, and how.
type Spec struct {
	// Name names the job; unique among the jobs of one election.
	Name string
	// Schedule gives the slots.
	Schedule Schedule
	// Action runs the job for one slot.
	Action Action
	// Timeout bounds each attempt. Zero means no bound but the term's.
	Timeout time.Duration
	// Retries is how many times a failed attempt is tried again, within the slot.
	Retries int
	// Backoff is the wait before the first retry; it doubles for every further one, up to
	// a minute.
	Backoff time.Duration
	// Overlap is OverlapSkip or OverlapWait (empty: skip).
	Overlap string
	// Missed is MissedRunOnce or MissedSkip (empty: run_once).
	Missed string
}

// Action runs one attempt of a run. ctx ends when the attempt times out or when the term
// that runs it stops admitting; a nil error is success.
type Action func(ctx context.Context, r Run) error

// Run is one run of a job, for one slot, under one term.
type Run struct {
	// Job is the job's name.
	Job string
	// Election is the election whose term runs it (a shard's, for a job on a shard set).
	Election string
	// Shard is the shard's number, or -1 for a job on an election.
	Shard int
	// Slot is the scheduled time the run is for.
	Slot time.Time
	// Token is the fencing token of the term that runs it.
	Token int64
	// Instance is the id of the instance that runs it.
	Instance string
	// Attempt counts the attempts of this run from 1.
	Attempt int
	// Missed is how many earlier slots this run stands for besides its own (MissedRunOnce
	// after a time without a leader).
	Missed int
	// Rerun is set when an earlier term started this slot and ended before it finished.
	Rerun bool
	// Manual is set for a run asked for by an operator (RunNow) rather than by a slot.
	Manual bool
}

// Lead is one election a job runs under, as *elector.Election provides it.
type Lead interface {
	Name() string
	Term() *elector.Term
	Enter() (*elector.Term, bool)
	Exit()
	Changed() <-chan struct{}
	Now() time.Time
}

// Events lets the caller hear of what runs (for metrics, logs and events). Every field
// may be nil; none may block.
type Events struct {
	// Started is called when a run begins (its first attempt), lateness after its slot.
	Started func(r Run, lateness time.Duration)
	// Finished is called when a run ends, with its result (Result*), how long it took and
	// its last error.
	Finished func(r Run, result string, took time.Duration, err error)
	// Missed is called when slots of the job in election pass without a run, for why
	// (Missed*).
	Missed func(job, election string, slots int, why string)
}

// Record is what the store keeps of a job in one election (Store's value, as JSON).
type Record struct {
	// Started is the slot last started, under the term that started it.
	Started *Mark `json:"started,omitempty"`
	// Finished is the slot last finished, and how.
	Finished *Mark `json:"finished,omitempty"`
	// Manual is the last run an operator asked for.
	Manual *Mark `json:"manual,omitempty"`
	// MissedSlots counts the slots missed since the record began.
	MissedSlots int64 `json:"missed_slots,omitempty"`
}

// Mark is one run as a Record keeps it.
type Mark struct {
	Slot     time.Time     `json:"slot"`
	Token    int64         `json:"token"`
	By       string        `json:"by"`
	At       time.Time     `json:"at"`
	Result   string        `json:"result,omitempty"`
	Took     time.Duration `json:"took,omitempty"`
	Error    string        `json:"error,omitempty"`
	Attempts int           `json:"attempts,omitempty"`
}

// Listing is one job as the admin API (GET /leader/jobs) and the status page report it:
// its settings and how it stands under each lead.
type Listing struct {
	// Job is the job's name.
	Job string `json:"job"`
	// Election is the election that runs it, ShardSet the set whose shards do.
	Election string `json:"election,omitempty"`
	ShardSet string `json:"shard_set,omitempty"`
	// Schedule is `every <interval>` or `cron <expression> [<zone>]`.
	Schedule string `json:"schedule"`
	// Request is the request's method and URL, as configured (headers and body left out:
	// they may hold secrets).
	Request string `json:"request"`
	// Timeout, Retries, Overlap and Missed are the job's settings, defaults filled in.
	Timeout string `json:"timeout"`
	Retries int    `json:"retries"`
	Overlap string `json:"overlap"`
	Missed  string `json:"missed"`
	// Leads are the job under its election, or under each shard of its set.
	Leads []Status `json:"leads"`
}

// Status is a job in one election as this instance sees it.
type Status struct {
	Job      string `json:"job"`
	Election string `json:"election"`
	Shard    int    `json:"shard"`
	Schedule string `json:"schedule"`
	// Leading is set when this instance runs the job's slots now.
	Leading bool `json:"leading"`
	// Record is the record as this instance last read or wrote it (nil if never).
	Record *Record `json:"record,omitempty"`
	// Running is the run in progress on this instance, if any.
	Running *Run `json:"running,omitempty"`
	// Next is the next slot.
	Next time.Time `json:"next"`
}
