package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
)

// Errors of RunNow.
var (
	// ErrNotLeading: this instance does not run the job's slots now (another instance
	// leads its election or shard, nobody does, or this term has not read the job's
	// record yet).
	ErrNotLeading = errors.New("this instance does not lead the job's election now")
	// ErrBusy: a run of the job is under way, or queued, on this instance.
	ErrBusy = errors.New("a run of the job is under way")
)

// Config is what a Runner needs besides the job.
type Config struct {
	// Instance is this instance's id, recorded with every run.
	Instance string
	// Logger logs runs; nil logs nothing.
	Logger *zap.Logger
	// Events hears of runs.
	Events Events
	// Now is the wall clock slots are reckoned on; nil is time.Now. (The terms' deadlines
	// are reckoned on each election's own clock, Lead.Now.)
	Now func() time.Time
}

// pollInterval is how often a runner with many leads (a shard set's) looks for shards whose
// owner changed: one goroutine per job checks them all, rather than one per shard.
const pollInterval = 100 * time.Millisecond

// storeTimeout bounds one store request of a runner.
const storeTimeout = 5 * time.Second

// maxBackoff caps the wait between retries of a failed attempt.
const maxBackoff = time.Minute

// Runner runs one job's slots under one election, or under every shard of a shard set, on
// this instance: under each lead, it runs the slots only while this instance's term there
// admits, one run at a time, and records each slot's start and finish in the store under
// that term's token (see the package comment of the record's rules in Store).
type Runner struct {
	spec    atomic.Pointer[Spec]
	store   Store
	cfg     Config
	units   []*unit
	kick    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	runs    sync.WaitGroup
	once    sync.Once
	started atomic.Bool
}

// NewRunner returns a runner of spec under leads: the job's one election, or the shards
// of a set in shard order, shards[i] being leads[i]'s shard (nil for an election). It
// starts nothing until Start.
func NewRunner(spec Spec, store Store, leads []Lead, shards []int, cfg Config) *Runner {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{store: store, cfg: cfg, kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	r.spec.Store(&spec)
	for i, l := range leads {
		shard := -1
		if shards != nil {
			shard = shards[i]
		}
		r.units = append(r.units, &unit{lead: l, shard: shard})
	}
	return r
}

// Start begins running the job's slots.
func (r *Runner) Start() {
	if r.started.CompareAndSwap(false, true) {
		go r.loop()
	}
}

// Stop stops running the job: no run starts any more, a run under way is cancelled (its
// slot is not finished, so the next term runs it again), and Stop returns once every run
// has ended. An instance that exits hands its elections over first, and the handover's
// drain lets a run under way finish before that (a run counts as in flight).
func (r *Runner) Stop() {
	r.once.Do(func() {
		r.cancel()
		if !r.started.CompareAndSwap(false, true) {
			<-r.done // started: the loop ends with the context
		}
		r.runs.Wait()
	})
}

// Update makes spec the job's spec from the next run on (a config reload). A changed
// schedule takes effect from the next slot.
func (r *Runner) Update(spec Spec) {
	old := r.spec.Swap(&spec)
	if old.Schedule.String() != spec.Schedule.String() {
		now := r.cfg.Now()
		for _, u := range r.units {
			u.mu.Lock()
			if u.token != 0 {
				u.next = spec.Schedule.Next(now)
			}
			u.mu.Unlock()
		}
	}
	r.wake()
}

func (r *Runner) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// unit is the job under one lead: what this instance knows of its record and runs there.
type unit struct {
	lead  Lead
	shard int

	mu sync.Mutex
	// token is the term the state below belongs to: 0 until this instance's term there
	// has read the record.
	token   int64
	since   time.Time // when this instance saw its term there admit first
	loading bool
	retryAt time.Time // a failed read of the record is tried again then
	rec     Record    // the record as this term last read or wrote it
	next    time.Time // the next slot to run under token
	queue   []Run     // runs due now, in order: a rerun, a catch-up, a manual one
	running *Run
	// missed counts slots missed under this term not yet in the record.
	missed int64
	// unrecorded is the finish of a slot this instance ran to its end under a term that
	// ended before the finish was written (the store unreachable): the instance's next
	// term writes it rather than run the slot again.
	unrecorded *Mark
}

// reset forgets a term's state: the term ended, or never read the record.
func (u *unit) resetLocked() {
	u.token, u.loading, u.queue, u.missed = 0, false, nil, 0
	u.rec = Record{}
}

// loop wakes at the next slot of any lead this instance runs, at every change of a single
// lead's term, at every poll of a set's leads, and when kicked.
func (r *Runner) loop() {
	defer close(r.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var changed <-chan struct{}
		if len(r.units) == 1 {
			changed = r.units[0].lead.Changed()
		}
		wait := time.Hour
		if changed == nil {
			wait = pollInterval
		}
		for _, u := range r.units {
			if d, ok := r.step(u); ok {
				wait = min(wait, d)
			}
		}
		timer.Reset(max(wait, 0))
		select {
		case <-r.ctx.Done():
			return
		case <-changed:
		case <-r.kick:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// step moves the job under u forward and returns how soon it wants to look again, if it
// has a slot to wait for.
func (r *Runner) step(u *unit) (time.Duration, bool) {
	t := u.lead.Term()
	leading := t.Leading(u.lead.Now())
	now := r.cfg.Now()
	spec := r.spec.Load()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.token != 0 && u.token != t.Token {
		u.resetLocked()
	}
	if !leading {
		if !t.Holds() || t.Token != u.token {
			u.since = time.Time{}
		}
		return 0, false
	}
	if u.since.IsZero() {
		u.since = now
	}
	if u.token == 0 {
		// A run of an earlier term still ending decides what this term owes (it may leave
		// a finish to record, see recordUnrecorded): the record is read once it is over.
		if !u.loading && u.running == nil && !now.Before(u.retryAt) {
			u.loading = true
			r.runs.Add(1)
			go r.load(u, t)
		}
		if !u.retryAt.IsZero() {
			return u.retryAt.Sub(now), true
		}
		return 0, false
	}
	if u.running != nil {
		if !u.next.After(now) && spec.Overlap != OverlapWait {
			// The slots that came during the run: counted, and the next one awaited.
			n, _ := dueSlots(spec.Schedule, u.next, now)
			r.miss(u, spec, n, MissedOverlap)
			u.next = spec.Schedule.Next(now)
		}
		return u.next.Sub(now), true
	}
	if len(u.queue) == 0 && !u.next.After(now) {
		n, newest := dueSlots(spec.Schedule, u.next, now)
		if n > 1 {
			r.miss(u, spec, n-1, MissedOverlap)
		}
		u.queue = append(u.queue, Run{Slot: newest})
		u.next = spec.Schedule.Next(newest)
	}
	if len(u.queue) > 0 {
		run := u.queue[0]
		u.queue = u.queue[1:]
		run.Job, run.Election, run.Shard, run.Instance, run.Token = spec.Name, u.lead.Name(), u.shard, r.cfg.Instance, t.Token
		u.running = &run
		r.runs.Add(1)
		go r.execute(u, t, run)
	}
	return u.next.Sub(now), true
}

// dueSlots counts the slots from first (a slot) up to now, and returns the newest of them.
// An interval's are counted by division, so that a schedule of milliseconds after a day
// without a leader costs nothing; a cron expression's (a minute apart at least) one by one.
func dueSlots(s Schedule, first, now time.Time) (n int, newest time.Time) {
	if first.After(now) {
		return 0, time.Time{}
	}
	if e, ok := s.(every); ok {
		d := time.Duration(e)
		k := now.Sub(first) / d
		return int(k) + 1, first.Add(k * d)
	}
	for slot := first; !slot.After(now); slot = s.Next(slot) {
		n, newest = n+1, slot
	}
	return n, newest
}

// miss counts n slots of the job under u as missed, for why. u.mu is held.
func (r *Runner) miss(u *unit, spec *Spec, n int, why string) {
	if n <= 0 {
		return
	}
	u.missed += int64(n)
	if f := r.cfg.Events.Missed; f != nil {
		f(spec.Name, u.lead.Name(), n, why)
	}
	r.cfg.Logger.Info("job slots missed", zap.String("job", spec.Name), zap.String("election", u.lead.Name()),
		zap.Int("slots", n), zap.String("why", why))
}

// load reads the job's record under this instance's new term t and plans what the term
// owes: the slot an ended term started and did not finish, then the slots nobody ran.
func (r *Runner) load(u *unit, t *elector.Term) {
	defer r.runs.Done()
	spec := r.spec.Load()
	ctx, cancel := context.WithTimeout(r.ctx, storeTimeout)
	raw, err := r.store.JobRecord(ctx, u.lead.Name(), spec.Name)
	cancel()
	var rec Record
	if err == nil && raw != nil {
		err = json.Unmarshal(raw, &rec)
	}
	now := r.cfg.Now()
	u.mu.Lock()
	defer r.wake()
	defer u.mu.Unlock()
	u.loading = false
	if err != nil {
		u.retryAt = now.Add(time.Second)
		r.cfg.Logger.Warn("cannot read the job's record; trying again", zap.String("job", spec.Name),
			zap.String("election", u.lead.Name()), zap.Error(err))
		return
	}
	if cur := u.lead.Term(); cur.Token != t.Token || !cur.Holds() {
		return // the term ended meanwhile
	}
	u.retryAt = time.Time{}
	if r.recordUnrecorded(u, t, &rec) {
		return // tried again at the next step
	}
	u.token, u.rec, u.queue, u.missed = t.Token, rec, nil, 0
	var last time.Time
	if s := rec.Started; s != nil {
		last = s.Slot
		if f := rec.Finished; f == nil || f.Slot.Before(s.Slot) {
			u.queue = append(u.queue, Run{Slot: s.Slot, Rerun: true})
		}
	}
	if f := rec.Finished; f != nil && f.Slot.After(last) {
		last = f.Slot
	}
	if last.IsZero() {
		// The job has never run: its first slot is the first that comes while this term
		// leads.
		u.next = spec.Schedule.Next(u.since.Add(-time.Nanosecond))
		return
	}
	// Slots that came before this term led were missed while nobody led (or while the term
	// before failed to run them); those since are this term's own and run anyway.
	n, newest := dueSlots(spec.Schedule, spec.Schedule.Next(last), now)
	u.next = spec.Schedule.Next(now)
	if n == 0 {
		return
	}
	ownSince := !newest.Before(u.since)
	if spec.Missed == MissedSkip && !ownSince {
		r.miss(u, spec, n, MissedNoLeader)
		return
	}
	if n > 1 {
		r.miss(u, spec, n-1, MissedNoLeader)
	}
	u.queue = append(u.queue, Run{Slot: newest, Missed: n - 1})
}

// recordUnrecorded writes, under this instance's new term t, the finish of the slot the
// record shows started and not finished if this instance ran that very run to its end
// (u.unrecorded): the slot is then finished, and not run again. It reports whether the
// write failed, in which case the term reads the record again later. u.mu is held.
func (r *Runner) recordUnrecorded(u *unit, t *elector.Term, rec *Record) (failed bool) {
	fin := u.unrecorded
	s := rec.Started
	if fin == nil || s == nil || !s.Slot.Equal(fin.Slot) || s.Token != fin.Token ||
		rec.Finished != nil && !rec.Finished.Slot.Before(s.Slot) {
		u.unrecorded = nil // another term settled the slot since
		return false
	}
	next := *rec
	next.Finished = fin
	value, _ := json.Marshal(next) // a struct of strings, numbers and times cannot fail
	ctx, cancel := context.WithTimeout(r.ctx, storeTimeout)
	ok, err := r.store.PutJobRecord(ctx, u.lead.Name(), r.spec.Load().Name, t.Token, value)
	cancel()
	if err != nil || !ok {
		u.retryAt = r.cfg.Now().Add(time.Second)
		return true
	}
	u.unrecorded, *rec = nil, next
	r.cfg.Logger.Info("recorded the finish of a slot this instance ran before its term ended",
		zap.String("job", r.spec.Load().Name), zap.String("election", u.lead.Name()), zap.Time("slot", fin.Slot))
	return false
}

// RunNow runs the job once now under the lead of shard (-1 for a job on an election),
// besides its slots, if this instance leads there and no run of the job is under way
// there. The run is recorded as the job's last manual run; it finishes no slot.
func (r *Runner) RunNow(shard int) (Run, error) {
	u := r.unitOf(shard)
	if u == nil {
		return Run{}, ErrNotLeading
	}
	t := u.lead.Term()
	if !t.Leading(u.lead.Now()) {
		return Run{}, ErrNotLeading
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.token != t.Token {
		return Run{}, ErrNotLeading
	}
	if u.running != nil || len(u.queue) > 0 {
		return Run{}, ErrBusy
	}
	run := Run{Job: r.spec.Load().Name, Election: u.lead.Name(), Shard: u.shard, Slot: r.cfg.Now(),
		Token: t.Token, Instance: r.cfg.Instance, Manual: true}
	u.queue = append(u.queue, run)
	r.wake()
	return run, nil
}

// unitOf is the unit of shard, nil if there is none.
func (r *Runner) unitOf(shard int) *unit {
	for _, u := range r.units {
		if u.shard == shard {
			return u
		}
	}
	return nil
}

// freshStatusBound is the number of leads up to which Status reads every record from the
// store; a shard set's larger runner reports what this instance knows, sparing the store
// a read per shard.
const freshStatusBound = 64

// Status reports the job under each lead, with its record read from the store (or, if the
// store does not answer, or the job runs on more than freshStatusBound shards, as this
// instance last knew it).
func (r *Runner) Status(ctx context.Context) []Status { return r.status(ctx, true) }

// Local is Status without a store request: each record as this instance last read or
// wrote it. It is cheap enough to call many times a second.
func (r *Runner) Local() []Status { return r.status(context.Background(), false) }

func (r *Runner) status(ctx context.Context, fresh bool) []Status {
	spec := r.spec.Load()
	now := r.cfg.Now()
	out := make([]Status, 0, len(r.units))
	for _, u := range r.units {
		t := u.lead.Term()
		st := Status{Job: spec.Name, Election: u.lead.Name(), Shard: u.shard, Schedule: spec.Schedule.String(),
			Leading: t.Leading(u.lead.Now())}
		u.mu.Lock()
		if u.token != 0 {
			rec := u.rec
			st.Record = &rec
			st.Next = u.next
		} else {
			st.Next = spec.Schedule.Next(now)
		}
		if u.running != nil {
			run := *u.running
			st.Running = &run
		}
		u.mu.Unlock()
		if !fresh || len(r.units) > freshStatusBound {
			out = append(out, st)
			continue
		}
		if raw, err := r.store.JobRecord(ctx, u.lead.Name(), spec.Name); err == nil && raw != nil {
			var rec Record
			if json.Unmarshal(raw, &rec) == nil {
				st.Record = &rec
			}
		}
		out = append(out, st)
	}
	return out
}
