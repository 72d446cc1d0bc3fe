package e2e

import (
	"fmt"
	"sync"
	"time"
)

// writers are clients that keep writing to the service through the instances' gates, each
// write tagged with the writer and a sequence number and acknowledged before the next,
// reconnecting through the next instance whenever a connection fails or stalls.
type writers struct {
	addrs func() []string // where to connect, in turn
	dial  func(addr string) (session, error)
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// session is one writer's connection: write sends a tagged write and waits for its
// acknowledgement, within replyTimeout.
type session interface {
	write(tag string) error
	Close() error
}

// replyTimeout is how long a writer waits for a connection or a reply before it gives the
// connection up: long enough for a handover's hold, short enough that a frozen instance
// does not keep it.
const replyTimeout = time.Second

func startWriters(n int, addrs func() []string, dial func(addr string) (session, error)) *writers {
	w := &writers{addrs: addrs, dial: dial, stop: make(chan struct{})}
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
		s, err := w.dial(addrs[turn%len(addrs)])
		turn++
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		for {
			seq++
			if err := s.write(fmt.Sprintf("w%d.%d", id, seq)); err != nil {
				break
			}
			select {
			case <-w.stop:
				s.Close()
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		s.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop stops the writers and waits for them. Idempotent.
func (w *writers) Stop() {
	w.once.Do(func() { close(w.stop) })
	w.wg.Wait()
}

// redisSession writes through the Redis protocol.
type redisSession struct{ *respConn }

func dialRedis(addr string) (session, error) {
	c, err := dialRESP(addr, replyTimeout)
	if err != nil {
		return nil, err
	}
	return redisSession{c}, nil
}

func (s redisSession) write(tag string) error {
	_ = s.SetDeadline(time.Now().Add(replyTimeout))
	_, err := s.do("EVAL", logScript, "0", tag)
	return err
}
