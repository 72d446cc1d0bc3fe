package elector

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// groupCommit sends one kind of store call (a release, a claim) through the store's
// Batcher: a call asked for while another is on its way waits, with every other asked for
// meanwhile, and they all go in one batch when that one is answered. A call that finds
// none on its way goes at once, alone, as the single Backend call, so a lone election's
// request is what it was. Nothing waits on a timer, and no goroutine is kept: batches are
// sent by one that ends when nothing is left. A shard set's thousands of shards ask at the
// same moments (a start, a SIGTERM), and one request per shard was what kept a set at a
// few hundred shards.
type groupCommit[In, Out any] struct {
	// single is the Backend call for one; batch (nil when the store does not batch, and
	// every call goes alone) the Batcher's for calls that join; it returns one Out per In,
	// in their order.
	single func(context.Context, In) (Out, error)
	batch  func(context.Context, []In) ([]Out, error)
	// joins reports whether next may go in the batch that first begins (the same lease,
	// say); election names the election of a call, which a batch holds at most once.
	joins    func(first, next In) bool
	election func(In) string
	// timeout, if set, bounds each request from the moment it is sent, alone or in a
	// batch, and the callers' contexts only how long they wait: a caller that waited for
	// the batches before its own would otherwise give up on a request that was never
	// late, and ask again, on a store already slow. Without it, a batch lasts until the
	// latest of its callers' deadlines.
	timeout time.Duration
	// sending, if set, is told of each call the moment its request is sent, alone or in a
	// batch, before the store can have applied it: a claim's term counts its first
	// heartbeat from there (see Election.read).
	sending func(In)
	// most, if set, bounds how many calls one batch carries; the rest wait for the next.
	// A batch's request must fit its timeout on a loaded store: a set's start asks
	// thousands of reads at once, and one batch of them all never did.
	most int

	mu      sync.Mutex
	busy    bool // a call or a batch is on its way
	pending []*pendingCall[In, Out]
}

type pendingCall[In, Out any] struct {
	ctx  context.Context
	in   In
	out  Out
	err  error
	done chan struct{}
}

// call is single(ctx, in), batched with the calls asked for meanwhile.
func (g *groupCommit[In, Out]) call(ctx context.Context, in In) (Out, error) {
	if g.batch == nil {
		g.sent(in)
		return g.single(ctx, in)
	}
	g.mu.Lock()
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if g.timeout > 0 {
			rctx, cancel = context.WithTimeout(ctx, g.timeout)
		}
		g.sent(in)
		out, err := g.single(rctx, in)
		cancel()
		g.next()
		return out, err
	}
	p := &pendingCall[In, Out]{ctx: ctx, in: in, done: make(chan struct{})}
	g.pending = append(g.pending, p)
	g.mu.Unlock()
	select {
	case <-p.done:
		return p.out, p.err
	case <-ctx.Done():
		// The batch may still carry it: as after any request its context ended, the
		// caller does not know whether it took effect.
		var none Out
		return none, ctx.Err()
	}
}

// next, once a call or a batch is answered, sends what waited meanwhile from a goroutine
// of its own, or marks the group idle.
func (g *groupCommit[In, Out]) next() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pending) == 0 {
		g.busy = false
		return
	}
	go g.flush()
}

// flush sends batches until nothing waits.
func (g *groupCommit[In, Out]) flush() {
	for {
		g.mu.Lock()
		if len(g.pending) == 0 {
			g.busy = false
			g.mu.Unlock()
			return
		}
		batch, rest := g.take(g.pending)
		g.pending = rest
		g.mu.Unlock()
		if len(batch) > 0 {
			g.send(batch)
		}
	}
}

// take splits off the first batch of pending: the calls that join the first one, each
// election once, at most most of them, in the order they came; the rest wait. A call
// whose caller gave up (its context ended) is dropped unsent: the caller took it as a
// request whose answer was lost, which it may be, and asks again if it still wants to.
// Sent, such calls would crowd out the ones asked again: a start whose batches were slow
// piled up hundreds.
func (g *groupCommit[In, Out]) take(pending []*pendingCall[In, Out]) (batch, rest []*pendingCall[In, Out]) {
	pending = slices.DeleteFunc(pending, func(p *pendingCall[In, Out]) bool { return p.ctx.Err() != nil })
	if len(pending) == 0 {
		return nil, nil
	}
	first := pending[0].in
	seen := make(map[string]bool, len(pending))
	for _, p := range pending {
		name := g.election(p.in)
		if !g.joins(first, p.in) || seen[name] || g.most > 0 && len(batch) == g.most {
			rest = append(rest, p)
			continue
		}
		seen[name] = true
		batch = append(batch, p)
	}
	return batch, rest
}

// send makes one batch, under a context that lasts for the timeout, or else until the
// latest of its callers' deadlines (a caller whose own context ends sooner has returned
// already).
func (g *groupCommit[In, Out]) send(batch []*pendingCall[In, Out]) {
	ctx, cancel := context.WithCancel(context.Background())
	if g.timeout > 0 {
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), g.timeout)
	} else if latest, ok := latestDeadline(batch); ok {
		cancel()
		ctx, cancel = context.WithDeadline(context.Background(), latest)
	}
	defer cancel()
	in := make([]In, len(batch))
	for i, p := range batch {
		in[i] = p.in
		g.sent(p.in)
	}
	out, err := g.batch(ctx, in)
	if err == nil && len(out) != len(in) {
		err = fmt.Errorf("the store answered %d of a batch of %d", len(out), len(in))
	}
	for i, p := range batch {
		if err == nil {
			p.out = out[i]
		}
		p.err = err
		close(p.done)
	}
}

// sent tells sending, if set, that in's request is being sent.
func (g *groupCommit[In, Out]) sent(in In) {
	if g.sending != nil {
		g.sending(in)
	}
}

// latestDeadline is the latest of the batch's callers' deadlines; ok is false when one of
// them has none.
func latestDeadline[In, Out any](batch []*pendingCall[In, Out]) (latest time.Time, ok bool) {
	for _, p := range batch {
		d, has := p.ctx.Deadline()
		if !has {
			return time.Time{}, false
		}
		if d.After(latest) {
			latest = d
		}
	}
	return latest, true
}
