package elector

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A campaign loop spends nearly all its life following the key: waiting for the watch, a
// holder's silence, a hold-off's end, a lost lease or a resync. A shard set has one loop
// per shard, so a waiting loop must cost no goroutine: a follower keeps what the wait needs
// as data, every source of news wakes it through a callback (the store's watch through
// WakingWatcher, the timers through time.AfterFunc, the lease and the context through
// context.AfterFunc), and a goroutine runs it only while there is news to handle. With no
// news it parks: the goroutine ends, and the next wake starts another one that carries
// the loop on from where it stood.

// follower is one pass of the campaign loop's follow: the watch of the key from after an
// observation, and the timers that bound the wait.
type follower struct {
	e       *Election
	ctx     context.Context // the campaign loop's
	l       *lease
	changes <-chan Observation
	stop    context.CancelFunc // ends the watch
	// state is followerRunning while a goroutine runs the loop, followerWoken if news
	// came meanwhile, followerParked while none does, followerEnded once it returned.
	state    atomic.Int32
	silent   alarm // the holder's silence runs out (see expireSilent)
	holdOver alarm // the hold-off ends
	// expireRetry spaces Expires that did not go through once the holder's silence has
	// run out (a stalled watch while the holder still writes, a store that fails), so
	// they are not tried as often as the timer's floor allows.
	expireRetry *backoff
	unhook      []func() bool // the context.AfterFuncs that wake it
	// retry is the campaign loop's backoff, for the loop's next passes.
	retry *backoff
}

const (
	followerRunning int32 = iota
	followerWoken
	followerParked
	followerEnded
)

// errParked is what loop returns when it parked: the campaign loop's goroutine ends there.
var errParked = parked{}

type parked struct{}

func (parked) Error() string { return "parked until news arrives" }

// newFollower starts following the key from after seen under lease l; hold is how long a
// hold-off still keeps this instance out (0 for none).
func (e *Election) newFollower(ctx context.Context, l *lease, seen Observation, hold time.Duration) *follower {
	f := &follower{e: e, ctx: ctx, l: l, expireRetry: newBackoff(50*time.Millisecond, max(50*time.Millisecond, e.c.cfg.TTL/4))}
	var wctx context.Context
	wctx, f.stop = context.WithCancel(ctx)
	f.changes = e.watchWaking(wctx, seen, f.wake)
	f.silent.wake, f.holdOver.wake = f.wake, f.wake
	if hold > 0 && hold < forever/2 {
		f.holdOver.set(hold)
	}
	f.silent.set(e.silenceLeft())
	f.unhook = append(f.unhook, context.AfterFunc(wctx, f.wake), context.AfterFunc(l.lostCtx, f.wake))
	e.following.Store(f)
	return f
}

// loop handles the news until the key must be read again (it returns nil: key deleted,
// lease lost, hold-off over, resync asked) or the watch breaks (its error), or until there
// is none left and it parks (errParked). On a pooled goroutine (see resumePool) it
// returns errHandOff, with the follow going on, before it would wait for the store.
func (f *follower) loop(pooled bool) error {
	for {
		if err, done := f.next(pooled); done {
			if err != errHandOff {
				f.end()
			}
			return err
		}
		if f.park() {
			return errParked
		}
	}
}

// errHandOff is what loop returns on a pooled goroutine when the follow has a store
// request to make: a goroutine of its own carries it on.
var errHandOff = handOff{}

type handOff struct{}

func (handOff) Error() string { return "handed off to a goroutine of its own" }

// runPooled runs the follow on a pool's goroutine until it parks; whatever comes after
// (a store request, the loop's next pass) goes on in a goroutine of its own.
func (f *follower) runPooled() {
	switch err := f.loop(true); err {
	case errParked:
	case errHandOff:
		go f.e.campaignFrom(f.ctx, f.retry, f, nil)
	default:
		go f.e.campaignFrom(f.ctx, f.retry, nil, err)
	}
}

// next handles what news there is; done says the follow is over, with the error loop
// returns. pooled says it runs on a pool's goroutine, which must not wait for the store.
func (f *follower) next(pooled bool) (err error, done bool) {
	e := f.e
	for {
		// One channel at a time: a look at an empty channel alone takes no lock, a
		// select over several locks them all, and this runs at every heartbeat heard.
		if closed(f.ctx.Done()) {
			return nil, true
		}
		if closed(f.l.lost) {
			// Renewals failed for a whole lease (or the store dropped it): what the
			// watch showed may be stale too, until the key is read again.
			e.loseLease(f.l)
			e.lostContact(f.l)
			return nil, true
		}
		select {
		case <-e.resync:
			return nil, true
		default:
		}
		if f.holdOver.take() {
			return nil, true
		}
		select {
		case o, ok := <-f.changes:
			if !ok {
				return errWatchClosed, true
			}
			if o.Err != nil {
				return o.Err, true
			}
			e.observe(o, f.l, true)
			if o.Holder == nil {
				e.vacated = &o
				return nil, true // vacant: campaign at once
			}
			f.expireRetry.reset()
			f.silent.set(e.silenceLeft())
			continue
		default:
		}
		if pooled && f.silent.fired() {
			return errHandOff, true // the expire is a store request
		}
		if f.silent.take() {
			done := e.expireSilent(f.ctx)
			next := e.silenceLeft()
			switch {
			case done:
				f.expireRetry.reset()
			case next <= time.Millisecond:
				next = f.expireRetry.step() // still overdue after a failed Expire: no spin
			}
			f.silent.set(next)
			continue
		}
		return nil, false
	}
}

// wake tells the follower there is news: a parked one is carried on in a new goroutine.
func (f *follower) wake() {
	for {
		switch s := f.state.Load(); s {
		case followerParked:
			if f.state.CompareAndSwap(s, followerRunning) {
				resumes.submit(f)
				return
			}
		case followerRunning:
			if f.state.CompareAndSwap(s, followerWoken) {
				return
			}
		default:
			return // woken already, or over
		}
	}
}

// closed reports whether ch is closed (or has a value, which the channels looked at
// here never get).
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A parked follow woken by news runs on a pool's goroutine: one started for each wake
// would grow its stack anew for every heartbeat heard (a set's owners beat every third
// of a ttl, for every shard), which costs more than the news. The pool's goroutines end
// when its queue is empty. A follow that has a store request to make, or whose campaign
// loop goes on to its next pass, leaves the pool for a goroutine of its own, so a slow
// store holds up no other shard's news.
type resumePool struct {
	mu      sync.Mutex
	queue   []*follower
	running int
}

// maxResumers is how many goroutines the pool runs at most.
const maxResumers = 8

var resumes resumePool

// submit queues f to be run, starting a goroutine if fewer than maxResumers run.
func (p *resumePool) submit(f *follower) {
	p.mu.Lock()
	p.queue = append(p.queue, f)
	start := p.running < maxResumers
	if start {
		p.running++
	}
	p.mu.Unlock()
	if start {
		go p.work()
	}
}

func (p *resumePool) work() {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.queue = nil
			p.running--
			p.mu.Unlock()
			return
		}
		f := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		p.mu.Unlock()
		f.runPooled()
	}
}

// park reports whether the goroutine running the loop may end: no news came since it last
// looked. Otherwise it looks again.
func (f *follower) park() bool {
	if f.state.CompareAndSwap(followerRunning, followerParked) {
		return true
	}
	f.state.Store(followerRunning)
	return false
}

// end stops the watch and the timers; wakes after it do nothing.
func (f *follower) end() {
	f.state.Store(followerEnded)
	f.e.following.CompareAndSwap(f, nil)
	f.stop()
	f.silent.stop()
	f.holdOver.stop()
	for _, u := range f.unhook {
		u()
	}
}

// watchWaking is watch for a follower: wake is called after each observation the watch
// queues and when it closes. A store that cannot call it (not a WakingWatcher) has its
// watch passed on by a goroutine that does.
func (e *Election) watchWaking(ctx context.Context, seen Observation, wake func()) <-chan Observation {
	if ww, ok := e.c.cfg.Backend.(WakingWatcher); ok {
		return ww.WatchWaking(ctx, e.name, seen, wake)
	}
	return PassOnWaking(ctx, e.watch(ctx, seen), wake)
}

// PassOnWaking passes the watch in on to a channel it returns, and calls wake after each
// observation it passes on and after it closes that channel: the WakingWatcher of a
// watch that needs a goroutine anyway.
func PassOnWaking(ctx context.Context, in <-chan Observation, wake func()) <-chan Observation {
	out := make(chan Observation, 1)
	go func() {
		defer func() {
			close(out)
			wake()
		}()
		for o := range in {
			select {
			case out <- o:
				wake()
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// alarm is a timer that wakes a follower and leaves a note that it fired. A note of an
// earlier setting is not left: the follower looks at the new one.
type alarm struct {
	wake func() // called when it fires; set before the first set
	mu   sync.Mutex
	t    *time.Timer
	at   time.Time // when the current setting fires
	due  bool
}

// set makes the alarm fire in d, and takes back a note not read yet.
func (a *alarm) set(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.due = false
	a.at = time.Now().Add(d)
	if a.t == nil {
		a.t = time.AfterFunc(d, a.fire)
		return
	}
	a.t.Reset(d)
}

func (a *alarm) fire() {
	a.mu.Lock()
	// A firing of an earlier setting that ran late, after a set, is not this one's.
	fired := !a.at.IsZero() && !time.Now().Before(a.at)
	if fired {
		a.due, a.at = true, time.Time{}
	}
	a.mu.Unlock()
	if fired {
		a.wake()
	}
}

// fired reports whether the alarm fired since it was set, and leaves the note.
func (a *alarm) fired() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.due
}

// take reports whether the alarm fired since it was set, and clears the note.
func (a *alarm) take() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	due := a.due
	a.due = false
	return due
}

func (a *alarm) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.at = time.Time{}
	if a.t != nil {
		a.t.Stop()
	}
}
