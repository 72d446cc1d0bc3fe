package pgbackend

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// listener holds the one connection on which a backend LISTENs, outside the pool (a
// pooled connection goes back to the pool, and its LISTEN with it), and wakes the watches
// of the election each notification names. Whenever it (re)connects it wakes every watch:
// notifications sent while it was away are lost.
type listener struct {
	b    *Backend
	cfg  *pgx.ConnConfig
	once sync.Once

	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

func newListener(b *Backend, cfg *pgx.ConnConfig) *listener {
	return &listener{b: b, cfg: cfg.Copy(), subs: make(map[string]map[chan struct{}]struct{})}
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

// subscribe returns a channel that receives a value after each notification for election
// (at most one pending), and the function that ends the subscription.
func (l *listener) subscribe(election string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.subs[election] == nil {
		l.subs[election] = make(map[chan struct{}]struct{})
	}
	l.subs[election][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs[election], ch)
		if len(l.subs[election]) == 0 {
			delete(l.subs, election)
		}
		l.mu.Unlock()
	}
}

func (l *listener) wake(election string, all bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, chans := range l.subs {
		if !all && name != election {
			continue
		}
		for ch := range chans {
			select {
			case ch <- struct{}{}:
			default:
			}
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
		l.wake("", true)
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
	l.wake("", true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.wake(n.Payload, false)
	}
}
