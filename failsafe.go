package caddyleader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddyleader/caddy-leader/elector"
)

// Failsafe is the `failsafe` option of the leader app: while the store cannot be reached
// (a transport error or a timeout, never an answer such as a lost compare or an expired
// lease), the leader keeps serving for as long as every live candidate it listed in the
// store (its roster) confirms it, every ttl/3, over this instance's failsafe endpoint. A
// candidate that confirms neither leads nor campaigns for a ttl afterwards. Every instance
// of the fleet must run with it, and each must reach every other's endpoint. The questions
// and answers are authenticated with the term's secret, which only readers of the store
// know (as forwarded requests are); see docs/safety.md for the argument and
// docs/operations.md for when to turn it on.
type Failsafe struct {
	// Listen is the address (host:port, or :port) at which this instance answers its
	// peers' failsafe questions, over plain HTTP. Required.
	Listen string `json:"listen,omitempty"`

	// URL is how the peers reach that listener, such as `http://10.0.0.5:7444`. Default:
	// http:// with the host of the app's advertise URL and the port of listen.
	URL string `json:"url,omitempty"`

	// Timeout bounds each question to a peer: a peer that does not answer within it
	// counts as one that refused, and the leader stops admitting. It must be below a
	// third of the ttl. Default: ttl/4.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// unmarshalFailsafe reads the `failsafe` option of the global `leader` option:
//
//	failsafe [<listen>] {
//		listen  <host:port>
//		url     <url>
//		timeout <duration>
//	}
//
// The listen address may be given as the option's argument or in the block.
func unmarshalFailsafe(d *caddyfile.Dispenser) (*Failsafe, error) {
	f := new(Failsafe)
	if d.NextArg() {
		f.Listen = d.Val()
		if d.NextArg() {
			return nil, d.Err("failsafe: takes at most one value, the listen address")
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch sub := d.Val(); sub {
		case "listen":
			if err := oneArg(d, &f.Listen); err != nil {
				return nil, err
			}
		case "url":
			if err := oneArg(d, &f.URL); err != nil {
				return nil, err
			}
			if err := checkUnlessPlaceholder(f.URL, checkAdvertise); err != nil {
				return nil, d.Errf("failsafe: url: %v", err)
			}
		case "timeout":
			if err := positiveDurationArg(d, &f.Timeout, 0); err != nil {
				return nil, err
			}
		default:
			return nil, d.Errf("unrecognized failsafe option %q", sub)
		}
	}
	if f.Listen == "" {
		return nil, d.Err("failsafe: the listen address is missing")
	}
	if err := checkUnlessPlaceholder(f.Listen, checkFailsafeListen); err != nil {
		return nil, d.Errf("failsafe: listen: %v", err)
	}
	return f, nil
}

// maxFailsafeBody bounds a failsafe message; real ones are a few hundred bytes.
const maxFailsafeBody = 64 << 10

// provision fills in the default URL from advertise.
func (f *Failsafe) provision(advertise string) {
	repl := caddy.NewReplacer()
	f.Listen = repl.ReplaceKnown(f.Listen, "")
	f.URL = repl.ReplaceKnown(f.URL, "")
	if f.URL != "" || advertise == "" {
		return
	}
	u, err := url.Parse(advertise)
	_, port, perr := net.SplitHostPort(f.Listen)
	if err == nil && perr == nil {
		f.URL = "http://" + net.JoinHostPort(u.Hostname(), port)
	}
}

// check names the first field that is wrong.
func (f *Failsafe) check(ttl time.Duration) error {
	if err := checkFailsafeListen(f.Listen); err != nil {
		return fmt.Errorf("failsafe: listen: %v", err)
	}
	if f.URL == "" {
		return errors.New("failsafe: url: not set, and there is no advertise URL to derive it from")
	}
	if err := checkAdvertise(f.URL); err != nil {
		return fmt.Errorf("failsafe: url: %v", err)
	}
	if err := checkFailsafeTimeout(time.Duration(f.Timeout), ttl); err != nil {
		return fmt.Errorf("failsafe: timeout: %v", err)
	}
	return nil
}

func checkFailsafeListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	return checkPort(port)
}

func checkFailsafeTimeout(timeout, ttl time.Duration) error {
	if timeout < 0 || (ttl > 0 && timeout >= ttl/3) {
		return fmt.Errorf("%s must be positive and below a third of the ttl (%s)", timeout, ttl/3)
	}
	return nil
}

// failsafeServer answers the peers' failsafe questions for one candidacy.
type failsafeServer struct {
	candidate *elector.Candidate
	server    *http.Server
	ln        net.Listener
}

// startFailsafeServer listens on f.Listen and passes every POST to c. Listening goes
// through Caddy, so that the next candidacy of a reload can listen on the same address
// while this one still does.
func startFailsafeServer(f *Failsafe, c *elector.Candidate, logger *zap.Logger) (*failsafeServer, error) {
	na, err := caddy.ParseNetworkAddress("tcp/" + f.Listen)
	if err != nil {
		return nil, fmt.Errorf("failsafe: listen: %v", err)
	}
	ln, err := na.Listen(context.Background(), 0, net.ListenConfig{})
	if err != nil {
		return nil, fmt.Errorf("failsafe: listen: %v", err)
	}
	s := &failsafeServer{candidate: c, ln: ln.(net.Listener)}
	s.server = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          zap.NewStdLog(logger),
	}
	go func() { _ = s.server.Serve(s.ln) }()
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *failsafeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "failsafe questions are POSTed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxFailsafeBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.candidate.FailsafeAnswer(r.Context(), body))
}

func (s *failsafeServer) close() error {
	return s.server.Close()
}

// failsafeTransport asks peers over HTTP. It ignores proxy settings from the environment:
// peers talk to each other directly.
type failsafeTransport struct{ client *http.Client }

func newFailsafeTransport() failsafeTransport {
	return failsafeTransport{client: directClient()}
}

// directClient is an HTTP client that ignores proxy settings from the environment and
// follows no redirect: the peer or service it asks is the one it names.
func directClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Ask implements elector.FailsafeTransport.
func (t failsafeTransport) Ask(ctx context.Context, url string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("failsafe endpoint %s: HTTP %d", url, resp.StatusCode)
	}
	return io.ReadAll(io.LimitReader(resp.Body, maxFailsafeBody))
}

// electorConfig is the candidacy's failsafe configuration.
func (f *Failsafe) electorConfig() *elector.FailsafeConfig {
	if f == nil {
		return nil
	}
	return &elector.FailsafeConfig{URL: f.URL, Timeout: time.Duration(f.Timeout), Transport: newFailsafeTransport()}
}

// fence is how a candidacy without failsafe mode fences another term's failsafe roster
// (elector.Config.Fence); nil when it has failsafe mode of its own.
func (f *Failsafe) fence() elector.FailsafeTransport {
	if f != nil {
		return nil
	}
	return newFailsafeTransport()
}

// Failsafe events, with the data election, self, token and reason (the cause, or why it
// ended).
const (
	// EventFailsafeStarted: this leader lost the store and leads on while its peers
	// confirm it.
	EventFailsafeStarted = "leader_failsafe_started"
	// EventFailsafeEnded: the failsafe is over (the store confirmed the term again, or
	// the term ended).
	EventFailsafeEnded = "leader_failsafe_ended"
)

var (
	failsafeRounds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "leader", Name: "failsafe_rounds_total",
		Help: "Failsafe rounds this leader sent, by result (confirmed: every peer accepted; refused: one refused or did not answer).",
	}, []string{"election", "result"})
	failsafeActiveDesc = prometheus.NewDesc("caddy_leader_failsafe_active",
		"1 while this instance leads the election through a failsafe (the store is unreachable), else 0.", []string{"election"}, nil)
)

// failsafeCollector reports caddy_leader_failsafe_active for every election when scraped.
type failsafeCollector struct{}

// Describe implements prometheus.Collector.
func (failsafeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- failsafeActiveDesc }

// Collect implements prometheus.Collector.
func (failsafeCollector) Collect(ch chan<- prometheus.Metric) {
	// A shard set counts as one: active while any of its shards is.
	active := map[string]float64{}
	for name, e := range runningElections() {
		label := metricLabel(name)
		if e.Failsafe().Active {
			active[label] = 1
		} else if _, ok := active[label]; !ok {
			active[label] = 0
		}
	}
	for label, v := range active {
		ch <- prometheus.MustNewConstMetric(failsafeActiveDesc, prometheus.GaugeValue, v, label)
	}
}

// FailsafeChanged implements elector.FailsafeObserver.
func (o *candidateObserver) FailsafeChanged(e *elector.Election, active bool, reason string) {
	name := EventFailsafeEnded
	if active {
		name = EventFailsafeStarted
	}
	o.enqueue(name, map[string]any{"election": e.Name(), "self": o.self, "token": e.Term().Token, "reason": reason})
}

// FailsafeRound implements elector.FailsafeObserver.
func (o *candidateObserver) FailsafeRound(e *elector.Election, refused bool) {
	result := "confirmed"
	if refused {
		result = "refused"
	}
	failsafeRounds.WithLabelValues(metricLabel(e.Name()), result).Inc()
}

// failsafeNote is the line `caddy leader status` prints about an election's failsafe;
// empty when there is nothing to say.
func failsafeNote(s *elector.FailsafeStatus, now time.Time) string {
	switch {
	case s == nil:
		return ""
	case s.Active:
		return fmt.Sprintf("failsafe: leading without the store for %s, while every peer confirms (%d rounds, %d refused); cause: %s",
			now.Sub(s.Since).Round(100*time.Millisecond), s.Rounds, s.Refused, s.Cause)
	case s.Confirming != 0:
		return fmt.Sprintf("failsafe: keeping term %d alive for %s more (the leader lost the store)", s.Confirming, s.ConfirmingFor.Round(100*time.Millisecond))
	}
	return ""
}

// failsafeKey is what of the failsafe option makes a candidacy: a change starts a new one.
func (f *Failsafe) key() string {
	if f == nil {
		return ""
	}
	return f.Listen + " " + f.URL + " " + strconv.FormatInt(int64(f.Timeout), 10)
}

var (
	_ elector.FailsafeObserver  = (*candidateObserver)(nil)
	_ elector.FailsafeTransport = failsafeTransport{}
	_ prometheus.Collector      = failsafeCollector{}
	_ http.Handler              = (*failsafeServer)(nil)
)
