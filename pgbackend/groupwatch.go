package pgbackend

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/caddyleader/caddy-leader/elector"
)

// The watches of a group's elections (a shard set's: every instance watches the key,
// the intents and the candidates of every shard) share their reads: one statement reads
// the whole group's rows of a kind, and each watch takes its election's from it and
// reports what it would have reported from a read of its own (watch.go's rules, a vacancy
// after the last write included). A watch that polled on its own would cost every
// instance a read per shard and poll interval; a feed costs one per group, however many
// shards. The feed reads when a watch joins (the read must start after the Watch call),
// on a notification about any of the group's rows (the listener relays each key's,
// intent's and candidate's to its group, and a beacon names the group), within the same
// bounds as a watch of its own (notificationReads), every poll interval, and a little
// past the moment something it read expires.

// feed is the shared read of one kind of a group's rows (T: the rows by election).
type feed[T any] struct {
	b     *Backend
	topic topic
	// read reads the group's rows; expiry is how long until the first of them expires
	// by the server's clock (0: none does).
	read func(ctx context.Context) (rows T, expiry time.Duration, err error)
	// pace is how long the timer alone waits after a read whose rows expire in expiry.
	pace func(expiry time.Duration) time.Duration
	// settle is how long a notification waits before the read, to make one read of a
	// burst.
	settle time.Duration
	// mark, if not nil, is told which of the group's elections each notification names
	// (see subscription), before the feed wakes up for it.
	mark func(election string, all bool)
	// changed, if not nil, says which elections a read's rows may show changed (all:
	// any of them); a read is handed only to the watches of those, and to watches that
	// have not looked at a read yet. The watches of such a feed each follow one election
	// (followKey): the others would see nothing new.
	changed func(rows T) (elections []string, all bool)

	mu      sync.Mutex
	subs    map[*feedSub[T]]struct{}
	byKey   map[string]map[*feedSub[T]]struct{} // the watches of each election (followKey)
	fresh   map[*feedSub[T]]struct{}            // watches that have not looked at a read yet
	keyless int                                 // watches of no election in particular
	reads   uint64                              // reads started
	running bool
	kick    chan struct{} // a watch joined: read at once
}

// feedRead is one read of the feed, the reads-th.
type feedRead[T any] struct {
	n    uint64
	rows T
	err  error
}

// feedSub is one watch of the feed: it takes the reads started after it joined. The feed's
// own goroutine hands it each read (look), so that a set of thousands of shards watches
// its rows without a goroutine per shard; look must not block (see offer).
type feedSub[T any] struct {
	after  uint64
	key    string // the election it follows ("": every read is for it)
	looked uint64 // the last read it was handed
	look   func(rows T) bool
	broken func(error)
	done   func()
	ended  bool
}

// follow runs a watch on the feed: look sees each read's rows, without blocking, until it
// returns false, a read fails (broken is told, without blocking), or ctx or the backend
// ends; then done is called. All three are called with f.mu held, one read at a time.
func (f *feed[T]) follow(ctx context.Context, broken func(error), look func(rows T) bool, done func()) {
	f.followKey(ctx, "", broken, look, done)
}

// followKey is follow for a watch of one election, key, whose rows are all it looks at.
func (f *feed[T]) followKey(ctx context.Context, key string, broken func(error), look func(rows T) bool, done func()) {
	sub := f.join(key, look, broken, done)
	if sub == nil {
		return
	}
	context.AfterFunc(ctx, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.endLocked(sub)
	})
}

// offer puts v in out if there is room, for a watch's look: a reader that has let out
// fill up has its watch ended (look returns false), and reads again.
func offer[T any](out chan<- T, v T) bool {
	select {
	case out <- v:
		return true
	default:
		return false
	}
}

// endLocked ends sub's watch (f.mu is held).
func (f *feed[T]) endLocked(sub *feedSub[T]) {
	if sub.ended {
		return
	}
	sub.ended = true
	delete(f.subs, sub)
	delete(f.fresh, sub)
	if sub.key == "" {
		f.keyless--
	} else if subs := f.byKey[sub.key]; subs != nil {
		delete(subs, sub)
		if len(subs) == 0 {
			delete(f.byKey, sub.key)
		}
	}
	sub.done()
}

// join adds a watch, starting the feed's reads if they are not running, and asks for a
// read. It returns nil, having ended the watch, once the backend has ended.
func (f *feed[T]) join(key string, look func(rows T) bool, broken func(error), done func()) *feedSub[T] {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.subs == nil {
		f.subs = map[*feedSub[T]]struct{}{}
		f.byKey = map[string]map[*feedSub[T]]struct{}{}
		f.fresh = map[*feedSub[T]]struct{}{}
		f.kick = make(chan struct{}, 1)
	}
	sub := &feedSub[T]{after: f.reads, key: key, look: look, broken: broken, done: done}
	if key == "" {
		f.keyless++
	} else {
		if f.byKey[key] == nil {
			f.byKey[key] = map[*feedSub[T]]struct{}{}
		}
		f.byKey[key][sub] = struct{}{}
	}
	if f.b.ctx.Err() != nil {
		f.endLocked(sub)
		return nil
	}
	f.subs[sub] = struct{}{}
	f.fresh[sub] = struct{}{}
	if !f.running {
		f.running = true
		f.b.wg.Add(1) // the feed's goroutine, counted, is running: Close has not begun waiting
		go f.run()
	}
	select {
	case f.kick <- struct{}{}:
	default:
	}
	return sub
}

// run reads the group's rows and hands each read to the watches, until none is left or
// the backend ends.
func (f *feed[T]) run() {
	defer f.b.wg.Done()
	notice, unsubscribe := f.b.listener.subscribe(f.topic, f.mark)
	defer unsubscribe()
	reads := notificationReads()
	for {
		f.mu.Lock()
		if len(f.subs) == 0 || f.b.ctx.Err() != nil {
			f.running = false
			for sub := range f.subs {
				f.endLocked(sub) // the backend ended
			}
			f.mu.Unlock()
			return
		}
		select {
		case <-f.kick: // this read serves the watches that joined so far
		default:
		}
		f.reads++
		r := &feedRead[T]{n: f.reads}
		f.mu.Unlock()
		var expiry time.Duration
		r.rows, expiry, r.err = f.read(f.b.ctx)
		f.mu.Lock()
		f.handLocked(r)
		f.mu.Unlock()
		f.sleep(f.pace(expiry), notice.wake, reads)
	}
}

// handLocked hands read r to the watches it is for: those that joined before it began,
// and, of a feed that knows which elections a read changed, only the watches of those and
// the ones that have not looked at a read yet. f.mu is held.
func (f *feed[T]) handLocked(r *feedRead[T]) {
	hand := func(sub *feedSub[T]) {
		if r.n <= sub.after || sub.looked == r.n || sub.ended {
			return
		}
		sub.looked = r.n
		delete(f.fresh, sub)
		switch {
		case r.err != nil:
			sub.broken(r.err)
			f.endLocked(sub)
		case !sub.look(r.rows):
			f.endLocked(sub)
		}
	}
	all := true
	var keys []string
	if r.err == nil && f.changed != nil && f.keyless == 0 {
		keys, all = f.changed(r.rows)
	}
	if all {
		for sub := range f.subs {
			hand(sub)
		}
		return
	}
	for _, key := range keys {
		for sub := range f.byKey[key] {
			hand(sub)
		}
	}
	for sub := range f.fresh {
		hand(sub)
	}
}

// sleep waits for a watch to join, a notification (then for reads to allow one more
// look, and settle), or d, whichever comes first, or for the backend to end.
func (f *feed[T]) sleep(d time.Duration, notice <-chan struct{}, reads *rate.Limiter) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-f.b.ctx.Done():
	case <-f.kick:
	case <-notice:
		if reads.Wait(f.b.ctx) == nil && f.settle > 0 {
			settle(f.b.ctx, f.settle)
		}
	case <-t.C:
	}
}

// keyPace is how long a watch of keys or intents waits for the timer alone: the poll
// interval, or a little past the moment something it read expires by the server's clock
// (0: nothing does) if that comes first.
func (b *Backend) keyPace(expiry time.Duration) time.Duration {
	d := time.Duration(b.poll.Load())
	if expiry > 0 {
		d = min(d, expiry+5*time.Millisecond)
	}
	return d
}

// readIntents reads the live intents of the group's elections, by election.
func (g *group) readIntents(ctx context.Context) (map[string]intentRow, time.Duration, error) {
	b := g.b
	if err := b.ready(ctx); err != nil {
		return nil, 0, err
	}
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`
SELECT election, value, rev, extract(epoch FROM expires_at - clock_timestamp())::float8
FROM %s WHERE starts_with(election, $1) AND expires_at > clock_timestamp()`, b.names.intents), g.prefix)
	if err != nil {
		return nil, 0, b.describe(err)
	}
	defer rows.Close()
	intents := map[string]intentRow{}
	var soonest time.Duration
	for rows.Next() {
		var (
			election  string
			in        intentRow
			remaining float64
		)
		if err := rows.Scan(&election, &in.value, &in.rev, &remaining); err != nil {
			return nil, 0, b.describe(err)
		}
		intents[election] = in
		if d := max(time.Millisecond, time.Duration(remaining*float64(time.Second))); soonest == 0 || d < soonest {
			soonest = d
		}
	}
	return intents, soonest, b.describe(rows.Err())
}

// readCandidates reads the live candidates of the group's elections, by election, each
// list as Candidates returns it.
func (g *group) readCandidates(ctx context.Context) (map[string][]elector.CandidateEntry, time.Duration, error) {
	b := g.b
	if err := b.ready(ctx); err != nil {
		return nil, 0, err
	}
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`
SELECT c.election, c.id, c.value, extract(epoch FROM l.expires_at - clock_timestamp())::float8
FROM %[1]s c JOIN %[2]s l ON l.id = c.lease
WHERE starts_with(c.election, $1) AND l.expires_at > clock_timestamp()
ORDER BY c.election, c.id`, b.names.candidates, b.names.leases), g.prefix)
	if err != nil {
		return nil, 0, b.describe(err)
	}
	defer rows.Close()
	lists := map[string][]elector.CandidateEntry{}
	var soonest time.Duration
	for rows.Next() {
		var (
			election  string
			en        elector.CandidateEntry
			remaining float64
		)
		if err := rows.Scan(&election, &en.ID, &en.Value, &remaining); err != nil {
			return nil, 0, b.describe(err)
		}
		lists[election] = append(lists[election], en)
		if d := max(time.Millisecond, time.Duration(remaining*float64(time.Second))); soonest == 0 || d < soonest {
			soonest = d
		}
	}
	return lists, soonest, b.describe(rows.Err())
}
