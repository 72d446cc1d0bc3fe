package safety

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// Outcome is what one client request of a load run ended with.
type Outcome struct {
	ReqID      string
	Target     string // the instance the client sent it to
	Status     int    // 0 when no answer came
	RetryAfter string
	Err        error
}

// LoadRun sends POSTs at a steady rate, round-robin over the instances that are up, as a
// load balancer in front of the fleet would. A refused connection (an instance that is
// shutting down) is retried on the next instance, as a load balancer does: the request was
// never sent. Anything else is the request's outcome.
type LoadRun struct {
	fleet  []*fleet.Instance
	client *http.Client
	down   sync.Map // *fleet.Instance -> true once the test stopped it
	next   atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	// Keys, when set, spread the requests over keys: request n goes to /gated/<Keys[n mod
	// len(Keys)]> (fleet.Config.ShardKeys has one per shard); else every request goes to
	// /gated/load.
	Keys []string
	// Results are the outcomes of the requests Run sent; read them once Run has returned.
	Results []Outcome
}

// NewLoadRun returns a load that sends to the instances of fl with client.
func NewLoadRun(fl []*fleet.Instance, client *http.Client) *LoadRun {
	return &LoadRun{fleet: fl, client: client}
}

// MarkDown takes an instance out of the rotation, as a load balancer's health check would.
func (l *LoadRun) MarkDown(in *fleet.Instance) { l.down.Store(in, true) }

// Add puts an instance started during the run into the rotation.
func (l *LoadRun) Add(in *fleet.Instance) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fleet = append(l.fleet[:len(l.fleet):len(l.fleet)], in)
}

// targets is the rotation as it is now.
func (l *LoadRun) targets() []*fleet.Instance {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fleet
}

// Run sends rate requests per second for d, then waits for every answer.
func (l *LoadRun) Run(rate int, d time.Duration) {
	stop := make(chan struct{})
	timer := time.AfterFunc(d, func() { close(stop) })
	defer timer.Stop()
	l.RunUntil(rate, stop)
}

// RunUntil sends rate requests per second until stop is closed, then waits for every
// answer: for a load that must cover an action of unknown length.
func (l *LoadRun) RunUntil(rate int, stop <-chan struct{}) {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-stop:
			l.wg.Wait()
			return
		case <-tick.C:
		}
		l.wg.Add(1)
		path := "/gated/load"
		if len(l.Keys) > 0 {
			path = "/gated/" + l.Keys[n%len(l.Keys)]
		}
		go func(id string) {
			defer l.wg.Done()
			o := l.send(id, path)
			l.mu.Lock()
			l.Results = append(l.Results, o)
			l.mu.Unlock()
		}(fmt.Sprintf("r%05d", n))
	}
}

func (l *LoadRun) send(id, path string) Outcome {
	var err error
	fleet := l.targets()
	for attempt := 0; attempt < 2*len(fleet); attempt++ {
		in := fleet[int(l.next.Add(1))%len(fleet)]
		if _, isDown := l.down.Load(in); isDown {
			continue
		}
		req, _ := http.NewRequest(http.MethodPost, in.URL()+path, strings.NewReader(`{"write":"`+id+`"}`))
		req.Header.Set("X-Req-Id", id)
		var resp *http.Response
		resp, err = l.client.Do(req)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			return Outcome{ReqID: id, Target: in.ID, Err: err}
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return Outcome{ReqID: id, Target: in.ID, Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
	}
	return Outcome{ReqID: id, Err: fmt.Errorf("no instance accepted the connection: %v", err)}
}

// Summarize counts outcomes by status (0 for no answer).
func Summarize(results []Outcome) map[int]int {
	counts := map[int]int{}
	for _, o := range results {
		counts[o.Status]++
	}
	return counts
}
