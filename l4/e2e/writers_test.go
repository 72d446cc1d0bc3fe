package e2e

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// writers are clients that keep writing to the service through the instances' gates, each
// write tagged with the writer and a sequence number, reconnecting through the next
// instance whenever a connection fails or stalls.
type writers struct {
	addrs func() []string // the gates to connect through, in turn
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	acked atomic.Int64
}

// replyTimeout is how long a writer waits for a reply before it gives the connection up:
// long enough for a handover's hold, short enough that a frozen instance does not keep it.
const replyTimeout = time.Second

func startWriters(n int, addrs func() []string) *writers {
	w := &writers{addrs: addrs, stop: make(chan struct{})}
	for i := range n {
		w.wg.Add(1)
		go w.run(i)
	}
	return w
}

func (w *writers) run(id int) {
	defer w.wg.Done()
	seq, turn := 0, id
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		addrs := w.addrs()
		addr := addrs[turn%len(addrs)]
		turn++
		c, err := dialRESP(addr, time.Second)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for {
			seq++
			_ = c.SetDeadline(time.Now().Add(replyTimeout))
			if _, err := c.do("EVAL", logScript, "0", fmt.Sprintf("w%d.%d", id, seq)); err != nil {
				break
			}
			w.acked.Add(1)
			select {
			case <-w.stop:
				c.Close()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop stops the writers and waits for them. Idempotent.
func (w *writers) Stop() {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
}
