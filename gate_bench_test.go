//go:build unix

package caddyleader

// Hot-path benchmarks: what the gate and the matcher cost one request, on a leader and on a
// follower of a real election (embedded etcd; -bench.store postgres: a PostgreSQL server of
// internal/testkit/pgtest). See BENCHMARKS.md for the numbers.
//
//	go test -run '^$' -bench . -benchmem -count 10 .
//
// What an iteration includes: all of the gate's ServeHTTP (Election.Enter and Exit, the
// forwarded-by header check, the replacer lookup in the request context, registering the
// placeholder provider, the request counter) and the call of a no-op next handler. What it does not include is Caddy's own per-request work: the
// request, its context and its replacer are built once, by Caddy's own PrepareRequest, and
// the replacer is put back to that state before every iteration (a struct copy, which the
// baseline sub-benchmark measures on its own). That is what Caddy hands every handler: a
// replacer whose providers slice already has room for a few more (NewReplacer's three
// providers plus the {http.*} one, capacity six), so the gate's repl.Map fits without
// growing it.
//
// Besides ns/op (wall time), the sequential benchmarks report cpu-ns/op on Linux: the CPU
// time of the benchmarking thread per iteration, which time the thread spends waiting for
// a core does not inflate. On a busy machine it is the steadier of the two.

import (
	"flag"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zaptest"

	"github.com/caddyleader/caddy-leader/elector"
	"github.com/caddyleader/caddy-leader/internal/testkit/etcdtest"
	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
	"github.com/caddyleader/caddy-leader/internal/testkit/pgtest"
	"github.com/caddyleader/caddy-leader/pgbackend"
)

// benchStore picks the store of the benchmarks' election. The hot path reads only the
// election's in-memory state, whichever store feeds it; -bench.store postgres shows it.
var benchStore = flag.String("bench.store", "etcd", "the store of the hot-path benchmarks' election: etcd or postgres")

// benchElections returns the election of a leading and of a following candidate, which
// read the production clock, so that the hot path measured is the one Caddy runs.
func benchElections(b *testing.B) (leading, following *elector.Election) {
	b.Helper()
	switch *benchStore {
	case "etcd":
		cluster := etcdtest.Start(b, 1)
		leader, follower := leaderAndFollower(b, cluster.Endpoints(), "bench", false)
		return leader.election, follower.election
	case "postgres":
		server := pgtest.Start(b)
		var es []*elector.Election
		for _, id := range []string{"a", "b"} {
			backend, err := pgbackend.New(pgbackend.Config{DSN: server.DSN()})
			if err != nil {
				b.Fatal(err)
			}
			_, e := fleet.StartCandidate(b, elector.Config{
				ID: id, URL: "http://" + id + ".test:8080", TTL: 3 * time.Second, DrainTimeout: 5 * time.Second,
				Backend: backend, Logger: zaptest.NewLogger(b).Named(id),
			}, "bench")
			es = append(es, e[0])
		}
		i, _ := fleet.WaitAgreed(b, 10*time.Second, es)
		return es[i], es[1-i]
	}
	b.Fatalf("-bench.store %q: use etcd or postgres", *benchStore)
	return nil, nil
}

// preparedRequest is a request as Caddy's server hands it to the first handler: built by
// gatedRequest, then finished by caddyhttp.PrepareRequest, which Caddy's server runs on
// every request (server values in the context, the {http.*} placeholder provider). It
// returns the replacer's state at that point, for reset.
func preparedRequest(method, target string, w http.ResponseWriter) (*http.Request, *caddy.Replacer, caddy.Replacer) {
	r, repl := gatedRequest(method, target)
	r = caddyhttp.PrepareRequest(r, repl, w, nil)
	return r, repl, *repl
}

// countingNext is the no-op handler behind the gate; it counts the requests it got.
type countingNext struct{ n int }

func (c *countingNext) ServeHTTP(http.ResponseWriter, *http.Request) error {
	c.n++
	return nil
}

// discardWriter is a ResponseWriter that keeps one header map and writes nowhere.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// cpuClock measures the CPU time of the calling goroutine's thread, which it locks, and
// reports it per iteration as cpu-ns/op when stopped. It measures nothing outside Linux.
type cpuClock struct {
	b     *testing.B
	start time.Duration
}

func startCPUClock(b *testing.B) *cpuClock {
	runtime.LockOSThread()
	return &cpuClock{b: b, start: threadCPU()}
}

func (c *cpuClock) stop() {
	used := threadCPU() - c.start
	runtime.UnlockOSThread()
	if runtime.GOOS == "linux" && c.b.N > 0 {
		c.b.ReportMetric(float64(used)/float64(c.b.N), "cpu-ns/op")
	}
}

// threadCPU is the user and system CPU time of this thread (RUSAGE_THREAD, Linux only).
func threadCPU() time.Duration {
	if runtime.GOOS != "linux" {
		return 0
	}
	const rusageThread = 1
	var ru syscall.Rusage
	if syscall.Getrusage(rusageThread, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkGate(b *testing.B) {
	leading, following := benchElections(b)
	stillLeading := func(b *testing.B) {
		if _, ok := leading.Check(); !ok {
			b.Fatal("the leader lost its election during the benchmark")
		}
	}

	// baseline: the loop, resetting the replacer and calling the no-op handler, without a
	// gate. Subtract it from the others for the gate's own cost.
	b.Run("baseline_no_gate", func(b *testing.B) {
		var next caddyhttp.Handler = &countingNext{}
		benchServe(b, "/write", func(w http.ResponseWriter, r *http.Request) { _ = next.ServeHTTP(w, r) })
	})

	b.Run("leader_admit", func(b *testing.B) {
		g := newGate(b, Gate{Election: "bench"}, leading)
		next := &countingNext{}
		benchServe(b, "/write", func(w http.ResponseWriter, r *http.Request) { _ = g.ServeHTTP(w, r, next) })
		if next.n != b.N {
			b.Fatalf("the gate admitted %d of %d requests", next.n, b.N)
		}
		stillLeading(b)
	})

	// With the admission's time and the term's deadline as placeholders: one allocation.
	b.Run("leader_admit_admission_times", func(b *testing.B) {
		g := newGate(b, Gate{Election: "bench", AdmissionTimes: true}, leading)
		next := &countingNext{}
		benchServe(b, "/write", func(w http.ResponseWriter, r *http.Request) { _ = g.ServeHTTP(w, r, next) })
		if next.n != b.N {
			b.Fatalf("the gate admitted %d of %d requests", next.n, b.N)
		}
		stillLeading(b)
	})

	// Routing by key: the key read from the request (a path segment, a header), hashed, and
	// its shard's election entered. Every shard here is the leading election, so every
	// request is admitted whatever its shard.
	owner := make([]*elector.Election, 4096)
	for i := range owner {
		owner[i] = leading
	}
	for _, tc := range []struct{ name, key, target string }{
		{"leader_admit_shard_key_path", "{http.request.uri.path.1}", "/write/room-42"},
		{"leader_admit_shard_key_query", "{http.request.uri.query.room}", "/write?room=room-42"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			g := newShardGate(b, Gate{ShardSet: "bench", ShardKey: tc.key}, owner...)
			next := &countingNext{}
			benchServe(b, tc.target, func(w http.ResponseWriter, r *http.Request) { _ = g.ServeHTTP(w, r, next) })
			if next.n != b.N {
				b.Fatalf("the gate admitted %d of %d requests", next.n, b.N)
			}
			stillLeading(b)
		})
	}

	// Two cores admitting at once through one gate share its election's in-flight counter.
	b.Run("leader_admit_parallel", func(b *testing.B) {
		g := newGate(b, Gate{Election: "bench"}, leading)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			w := &discardWriter{h: http.Header{}}
			r, repl, fresh := preparedRequest(http.MethodPost, "/write", w)
			next := &countingNext{}
			for pb.Next() {
				*repl = fresh
				if err := g.ServeHTTP(w, r, next); err != nil {
					b.Error(err)
					return
				}
			}
		})
		stillLeading(b)
	})

	b.Run("follower_reject", func(b *testing.B) {
		g := newGate(b, Gate{Election: "bench"}, following)
		next := &countingNext{}
		benchServe(b, "/write", func(w http.ResponseWriter, r *http.Request) {
			if g.ServeHTTP(w, r, next) == nil {
				b.Fatal("a follower admitted a gated request")
			}
		})
	})

	b.Run("follower_redirect", func(b *testing.B) {
		g := newGate(b, Gate{Election: "bench", Follower: FollowerRedirect}, following)
		next := &countingNext{}
		w := benchServe(b, "/write?x=1", func(w http.ResponseWriter, r *http.Request) { _ = g.ServeHTTP(w, r, next) })
		if next.n != 0 || w.h.Get("Location") == "" {
			b.Fatalf("a follower passed %d requests on, Location %q", next.n, w.h.Get("Location"))
		}
	})
}

// benchServe times serve on one prepared request per iteration, putting the replacer back
// to its fresh state each time as Caddy hands every request a new one. It returns the
// writer for the caller's checks.
func benchServe(b *testing.B, target string, serve func(http.ResponseWriter, *http.Request)) *discardWriter {
	w := &discardWriter{h: http.Header{}}
	r, repl, fresh := preparedRequest(http.MethodPost, target, w)
	b.ReportAllocs()
	cpu := startCPUClock(b)
	for b.Loop() {
		*repl = fresh
		serve(w, r)
	}
	cpu.stop()
	return w
}

func BenchmarkMatcher(b *testing.B) {
	leading, following := benchElections(b)
	for _, tc := range []struct {
		name string
		e    *elector.Election
		want bool
	}{{"leader", leading, true}, {"follower", following, false}} {
		b.Run(tc.name, func(b *testing.B) {
			m := &Matcher{Election: "bench", election: tc.e, placeholders: new(placeholderCache)}
			r, repl, fresh := preparedRequest(http.MethodGet, "/", httptest.NewRecorder())
			b.ReportAllocs()
			cpu := startCPUClock(b)
			for b.Loop() {
				*repl = fresh
				if m.Match(r) != tc.want {
					b.Fatalf("Match = %v, want %v", !tc.want, tc.want)
				}
			}
			cpu.stop()
		})
	}
}

// BenchmarkElection is the elector's share of the gate: the per-request check on its own.
func BenchmarkElection(b *testing.B) {
	leading, _ := benchElections(b)
	b.Run("Enter_Exit", func(b *testing.B) {
		b.ReportAllocs()
		cpu := startCPUClock(b)
		for b.Loop() {
			if _, ok := leading.Enter(); !ok {
				b.Fatal("not leading")
			}
			leading.Exit()
		}
		cpu.stop()
	})
	b.Run("Term_Leading", func(b *testing.B) {
		b.ReportAllocs()
		cpu := startCPUClock(b)
		for b.Loop() {
			if !leading.Term().Leading(time.Now()) {
				b.Fatal("not leading")
			}
		}
		cpu.stop()
	})
	b.Run("time_Now", func(b *testing.B) {
		cpu := startCPUClock(b)
		for b.Loop() {
			_ = time.Now()
		}
		cpu.stop()
	})

	// What-if: the same check with one clock read instead of two. time.Now reads the wall
	// clock and the monotonic clock; time.Since of a time that has a monotonic reading
	// reads only the monotonic one. (This clock's wall reading is derived from the
	// monotonic one, so it does not do what the wall-clock half of the check is for:
	// counting time while a machine is suspended.)
	base := time.Now()
	monoNow := func() time.Time { return base.Add(time.Since(base)) }
	b.Run("Term_Leading_monotonic_clock_only", func(b *testing.B) {
		b.ReportAllocs()
		cpu := startCPUClock(b)
		for b.Loop() {
			if !leading.Term().Leading(monoNow()) {
				b.Fatal("not leading")
			}
		}
		cpu.stop()
	})
	b.Run("time_Since", func(b *testing.B) {
		cpu := startCPUClock(b)
		for b.Loop() {
			_ = time.Since(base)
		}
		cpu.stop()
	})
}
