package fleet

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// Target is an instance that a Poller can send requests to: *Instance, or a type that
// wraps one.
type Target interface {
	comparable
	Do(ctx context.Context, method, path string, body []byte) (Response, error)
}

// Served is one 200 answer of /gated seen by a Poller.
type Served[M Target] struct {
	From   M
	Gated  Gated
	SentAt time.Time
	At     time.Time // when the answer arrived
}

// Poller sends GET /gated to every instance of a fleet in a tight loop, one goroutine per
// instance, and records every 200. After an answer other than 200 or none it pauses 1ms,
// so it sees a takeover up to about 1ms late.
type Poller[M Target] struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	served   []Served[M]
	answered map[M]int     // answers of any status
	failed   map[M]int     // requests without an answer
	refused  map[M]int     // answers other than 200
	notify   chan struct{} // closed and replaced on every 200
}

// StartPoller starts polling fleet; Stop ends it.
func StartPoller[M Target](fleet []M) *Poller[M] {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Poller[M]{
		cancel:   cancel,
		answered: make(map[M]int),
		failed:   make(map[M]int),
		refused:  make(map[M]int),
		notify:   make(chan struct{}),
	}
	for _, in := range fleet {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for ctx.Err() == nil {
				sent := time.Now()
				resp, err := in.Do(ctx, http.MethodGet, "/gated", nil)
				p.record(in, sent, resp, err)
				if err != nil || resp.Status != http.StatusOK {
					// A dead or frozen instance fails fast or times out; do not spin.
					select {
					case <-ctx.Done():
					case <-time.After(time.Millisecond):
					}
				}
			}
		}()
	}
	return p
}

func (p *Poller[M]) record(in M, sent time.Time, resp Response, err error) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			p.failed[in]++
		}
		return
	}
	p.answered[in]++
	if resp.Status != http.StatusOK {
		p.refused[in]++
		return
	}
	g, perr := ParseGated(resp.Body)
	if perr != nil {
		g = Gated{Self: "unparsable: " + resp.Body, Token: -1}
	}
	p.served = append(p.served, Served[M]{From: in, Gated: g, SentAt: sent, At: now})
	close(p.notify)
	p.notify = make(chan struct{})
}

// WaitServed waits until some 200 satisfies ok, and returns the first that did; after
// within it fails t.
func (p *Poller[M]) WaitServed(t T, within time.Duration, what string, ok func(Served[M]) bool) Served[M] {
	t.Helper()
	timeout := time.After(within)
	for {
		p.mu.Lock()
		for _, s := range p.served {
			if ok(s) {
				p.mu.Unlock()
				return s
			}
		}
		notify := p.notify
		p.mu.Unlock()
		select {
		case <-notify:
		case <-timeout:
			t.Fatalf("no 200 on /gated from an instance %s within %v", what, within)
			return Served[M]{}
		}
	}
}

// Stop ends polling and returns every 200 seen.
func (p *Poller[M]) Stop() []Served[M] {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Served[M](nil), p.served...)
}

// Failed is how many requests to in got no answer.
func (p *Poller[M]) Failed(in M) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed[in]
}

// Refused is how many requests to in were answered with another status than 200.
func (p *Poller[M]) Refused(in M) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused[in]
}

// Answered is how many requests to in got an answer, of any status.
func (p *Poller[M]) Answered(in M) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.answered[in]
}
