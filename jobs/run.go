package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
)

// execute carries out run of the job under u, in this instance's term t. The run counts as
// in flight in the election from its start record to its finish record, so a handover's
// drain waits for it; it is cancelled the moment the term stops admitting otherwise.
func (r *Runner) execute(u *unit, t *elector.Term, run Run) {
	defer r.runs.Done()
	defer r.wake()
	spec := r.spec.Load()
	entered, ok := u.lead.Enter()
	if !ok || entered.Token != t.Token {
		if ok {
			u.lead.Exit()
		}
		r.endRun(u, run, nil, true)
		return
	}
	defer u.lead.Exit()
	ctx, stop := termContext(r.ctx, u.lead, entered)
	defer stop()

	start := r.cfg.Now()
	mark := &Mark{Slot: run.Slot, Token: run.Token, By: run.Instance, At: start}
	rec, ok := r.record(ctx, u, run, func(rec *Record) {
		if run.Manual {
			rec.Manual = mark
		} else {
			rec.Started = mark
		}
	})
	if !ok {
		r.endRun(u, run, nil, false)
		return
	}
	var lateness time.Duration
	if !run.Manual {
		lateness = start.Sub(run.Slot)
	}
	if f := r.cfg.Events.Started; f != nil {
		f(run, lateness)
	}
	log := r.cfg.Logger.With(zap.String("job", run.Job), zap.String("election", run.Election),
		zap.Time("slot", run.Slot), zap.Int64("token", run.Token))
	log.Debug("job run started", zap.Duration("lateness", lateness), zap.Bool("rerun", run.Rerun),
		zap.Int("missed", run.Missed), zap.Bool("manual", run.Manual))

	result, attempts, err := r.attempt(ctx, spec, run)
	run.Attempt = attempts
	took := r.cfg.Now().Sub(start)
	if result != ResultCancelled {
		fin := &Mark{Slot: run.Slot, Token: run.Token, By: run.Instance, At: r.cfg.Now(), Result: result,
			Took: took, Attempts: attempts}
		if err != nil {
			fin.Error = err.Error()
		}
		rec, ok = r.record(ctx, u, run, func(rec *Record) {
			if run.Manual {
				rec.Manual = fin
			} else {
				rec.Finished = fin
			}
		})
		if !ok && !run.Manual {
			// The run ended but its term did before the record said so: another instance's
			// next term runs the slot again, under its higher token; this instance's own
			// next term records the finish it knows of instead (see load).
			u.mu.Lock()
			u.unrecorded = fin
			u.mu.Unlock()
			result = ResultCancelled
		}
	}
	if f := r.cfg.Events.Finished; f != nil {
		f(run, result, took, err)
	}
	switch result {
	case ResultOK:
		log.Info("job run finished", zap.Duration("took", took), zap.Int("attempts", attempts))
	case ResultCancelled:
		log.Warn("job run cancelled: its term stopped admitting; the next term runs the slot again",
			zap.Duration("took", took), zap.Error(err))
	default:
		log.Warn("job run failed", zap.String("result", result), zap.Duration("took", took),
			zap.Int("attempts", attempts), zap.Error(err))
	}
	if result == ResultCancelled {
		r.endRun(u, run, nil, false)
		return
	}
	r.endRun(u, run, &rec, false)
}

// attempt runs the job's action until it succeeds, its retries are spent, or ctx ends.
func (r *Runner) attempt(ctx context.Context, spec *Spec, run Run) (result string, attempts int, err error) {
	backoff := spec.Backoff
	if backoff <= 0 {
		backoff = time.Second
	}
	for attempts = 1; ; attempts++ {
		run.Attempt = attempts
		actx, cancel := ctx, context.CancelFunc(func() {})
		if spec.Timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, spec.Timeout)
		}
		err = spec.Action(actx, run)
		timedOut := ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded)
		cancel()
		switch {
		case err == nil:
			return ResultOK, attempts, nil
		case ctx.Err() != nil:
			return ResultCancelled, attempts, err
		case attempts > spec.Retries && timedOut:
			return ResultTimeout, attempts, err
		case attempts > spec.Retries:
			return ResultFailed, attempts, err
		}
		wait := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			wait.Stop()
			return ResultCancelled, attempts, err
		case <-wait.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// record writes the job's record under u, changed by change, under run's term, and
// returns it. It tries again after a store error, for as long as ctx (the term) lasts,
// and reports false when the term can no longer write: it ended, or the store refused the
// token.
func (r *Runner) record(ctx context.Context, u *unit, run Run, change func(*Record)) (Record, bool) {
	u.mu.Lock()
	if u.token != run.Token {
		u.mu.Unlock()
		return Record{}, false
	}
	rec, missed := u.rec, u.missed
	u.mu.Unlock()
	rec.MissedSlots += missed
	change(&rec)
	value, _ := json.Marshal(rec) // a struct of strings, numbers and times cannot fail
	retry := 50 * time.Millisecond
	for {
		wctx, cancel := context.WithTimeout(ctx, storeTimeout)
		ok, err := r.store.PutJobRecord(wctx, run.Election, run.Job, run.Token, value)
		cancel()
		switch {
		case err == nil && ok:
			u.mu.Lock()
			if u.token == run.Token {
				u.rec = rec
				u.missed -= missed
			}
			u.mu.Unlock()
			return rec, true
		case err == nil:
			return Record{}, false
		}
		r.cfg.Logger.Warn("cannot write the job's record; trying again", zap.String("job", run.Job),
			zap.String("election", run.Election), zap.Error(err))
		wait := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			wait.Stop()
			return Record{}, false
		case <-wait.C:
		}
		retry = min(2*retry, time.Second)
	}
}

// endRun marks the run on u over. A run that never started (its term stopped admitting
// first) goes back to the head of the queue if retry is set, for the term to start again
// should it admit again.
func (r *Runner) endRun(u *unit, run Run, rec *Record, retry bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.running = nil
	if u.token != run.Token {
		return
	}
	if rec != nil {
		u.rec = *rec
	}
	if retry {
		u.queue = append([]Run{run}, u.queue...)
	}
}

// termContext returns a context that ends when term t of l stops admitting: its deadline
// passes (on the election's clock), it ends, or it begins to release. A drain does not
// end it: a handover waits for the runs in flight, up to its drain timeout, and releases
// only then.
func termContext(parent context.Context, l Lead, t *elector.Term) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for {
			changed := l.Changed()
			left := t.Remaining(l.Now())
			cur := l.Term()
			if left <= 0 || cur.Token != t.Token || !cur.Holds() || cur.Releasing {
				cancel()
				return
			}
			timer.Reset(left)
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-timer.C:
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
	}()
	return ctx, cancel
}
