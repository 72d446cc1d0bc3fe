package main

import (
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// writer sends POST /write to some nodes in turn, in the background, and keeps every
// answer: the load that shows whether a takeover loses writes.
type writer struct {
	done chan struct{}
	quit chan struct{}
	once sync.Once

	mu      sync.Mutex
	answers []string // "status body"
}

// startWrites starts a writer on the given nodes; it stops by itself after 10s.
func (d *demo) startWrites(nodes ...int) *writer {
	w := &writer{done: make(chan struct{}), quit: make(chan struct{})}
	go func() {
		defer close(w.done)
		deadline := time.Now().Add(10 * time.Second)
		for n := 0; time.Now().Before(deadline); n++ {
			select {
			case <-w.quit:
				return
			default:
			}
			a := d.request(http.MethodPost, nodes[n%len(nodes)], "/write")
			w.mu.Lock()
			w.answers = append(w.answers, a.code()+" "+a.body)
			w.mu.Unlock()
		}
	}()
	d.mu.Lock()
	d.writer = w
	d.mu.Unlock()
	return w
}

// halt tells the writer to send no more requests, without waiting for it.
func (w *writer) halt() { w.once.Do(func() { close(w.quit) }) }

// stop ends the writer, waiting for the request in flight (hold, then the 5s timeout).
func (w *writer) stop() {
	w.halt()
	select {
	case <-w.done:
	case <-time.After(12 * time.Second):
	}
}

// writes sums a writer's answers up.
type writes struct {
	sent, ok int
	by       string // who accepted them, in order, e.g. "node-1 node-3"
	failed   string // the commonest failures, counted
}

var acceptedByRE = regexp.MustCompile(`accepted by (node-[0-9]*)`)

// stopWrites stops d's writer and sums its answers up.
func (d *demo) stopWrites(w *writer) writes {
	w.stop()
	d.mu.Lock()
	d.writer = nil
	d.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	s := writes{sent: len(w.answers)}
	var by []string
	counts := map[string]int{}
	for _, a := range w.answers {
		if strings.HasPrefix(a, "200 ") {
			s.ok++
			if m := acceptedByRE.FindStringSubmatch(a); m != nil && (len(by) == 0 || by[len(by)-1] != m[1]) {
				by = append(by, m[1])
			}
			continue
		}
		if len(a) > 120 {
			a = a[:120]
		}
		counts[a]++
	}
	s.by = strings.Join(by, " ")
	failures := make([]string, 0, len(counts))
	for a := range counts {
		failures = append(failures, a)
	}
	sort.Strings(failures)
	var parts []string
	for _, a := range failures[:min(3, len(failures))] {
		parts = append(parts, fmt.Sprintf("%d %s;", counts[a], a))
	}
	s.failed = strings.Join(parts, "")
	return s
}

// orNobody is by, or "nobody" when no write was accepted.
func orNobody(by string) string {
	if by == "" {
		return "nobody"
	}
	return by
}
