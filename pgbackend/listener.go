package pgbackend

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// listener holds the one connection on which a backend LISTENs, outside the pool (a
// pooled connection goes back to the pool, and its LISTEN with it), and wakes the watches
// each notification is about (see notice). Whenever it (re)connects it wakes every watch:
// notifications sent while it was away are lost.
type listener struct {
	b    *Backend
	cfg  *pgx.ConnConfig
	once sync.Once

	// up is set while the connection LISTENs: a change committed meanwhile reaches the
	// watches as a notification. While it is not, only a read of everything finds changes.
	up atomic.Bool

	mu   sync.Mutex
	subs map[topic]map[*subscription]struct{}
}

func newListener(b *Backend, cfg *pgx.ConnConfig) *listener {
	return &listener{b: b, cfg: cfg.Copy(), subs: make(map[topic]map[*subscription]struct{})}
}

// start connects in the background, once.
func (l *listener) start() {
	if l.b.cfg.DisableListen {
		return
	}
	l.once.Do(func() {
		l.b.wg.Add(1)
		go func() {
			defer l.b.wg.Done()
			l.run(l.b.ctx)
		}()
	})
}

// stop is a no-op: the backend's context ends run.
func (l *listener) stop() {}

// subscription is one watch's: a wake-up after each notification about its topic (at most
// one pending). A group's watch may also be told, before the wake-up, which of the group's
// elections a notification named (mark; all when notifications may have been lost).
type subscription struct {
	wake chan struct{}
	mark func(election string, all bool)
}

// notify wakes s up.
func (s *subscription) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// subscribe returns a subscription to t and the function that ends it; mark, if not nil,
// is told the elections that notifications about t name (see subscription).
func (l *listener) subscribe(t topic, mark func(election string, all bool)) (*subscription, func()) {
	s := &subscription{wake: make(chan struct{}, 1), mark: mark}
	l.mu.Lock()
	if l.subs[t] == nil {
		l.subs[t] = make(map[*subscription]struct{})
	}
	l.subs[t][s] = struct{}{}
	l.mu.Unlock()
	return s, func() {
		l.mu.Lock()
		delete(l.subs[t], s)
		if len(l.subs[t]) == 0 {
			delete(l.subs, t)
		}
		l.mu.Unlock()
	}
}

// deliver wakes the subscriptions a notification's payload is about.
func (l *listener) deliver(payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range parseNotice(payload) {
		for s := range l.subs[t] {
			s.notify()
		}
		if g, ok := groupTopic(t); ok {
			for s := range l.subs[g] {
				if s.mark != nil {
					s.mark(t.election, false)
				}
				s.notify()
			}
		}
	}
}

// wakeAll wakes every subscription: notifications may have been lost.
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, subs := range l.subs {
		for s := range subs {
			if s.mark != nil {
				s.mark("", true)
			}
			s.notify()
		}
	}
}

func (l *listener) run(ctx context.Context) {
	retry := 100 * time.Millisecond
	var warned bool
	for ctx.Err() == nil {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		l.wakeAll()
		if !warned {
			l.b.cfg.Logger.Warn("postgres LISTEN connection lost; watches poll until it is back", zap.Error(l.b.describe(err)))
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, 5*time.Second)
	}
}

// listening reports whether every change committed from now on will reach the watches as a
// notification (until the next wakeAll, which says when that stops).
func (l *listener) listening() bool { return l.up.Load() }

// listen connects, LISTENs, and relays notifications until the connection fails.
func (l *listener) listen(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg) // bounded by the config's ConnectTimeout

	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+l.b.names.channel); err != nil {
		return err
	}
	l.up.Store(true)
	defer l.up.Store(false) // before run's wakeAll: the reads it asks for are whole
	l.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.deliver(n.Payload)
	}
}
