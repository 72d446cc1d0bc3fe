package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/caddyleader/caddy-leader/internal/testkit/fleet"
)

// startEtcd starts the single-member etcd and returns once it listens.
func (d *demo) startEtcd() {
	p, err := fleet.StartProcess(fleet.ProcessSpec{
		Path: etcdBin,
		Args: []string{
			"-listen", fmt.Sprintf("%s:%d", host, d.etcdPort),
			"-peer", fmt.Sprintf("%s:%d", host, d.peerPort),
			"-data-dir", filepath.Join(d.tmp, "etcd"),
		},
		LogPath: filepath.Join(d.logs, "etcd.log"),
	})
	if err != nil {
		d.fail(fmt.Sprintf("etcd: %v", err))
	}
	d.mu.Lock()
	d.etcd = p
	d.mu.Unlock()
	if err := p.WaitReady(20*time.Second, fleet.ListeningOn(fmt.Sprintf("%s:%d", host, d.etcdPort))); err != nil {
		log := filepath.Join(d.logs, "etcd.log")
		if !p.Running() {
			d.fail("etcd exited at start; see "+log, "etcd")
		}
		d.fail(fmt.Sprintf("etcd did not listen on %d within 20s; see %s", d.etcdPort, log), "etcd")
	}
}

// startNode starts node-i and returns once it serves HTTP.
func (d *demo) startNode(i int) {
	dir := filepath.Join(d.tmp, fmt.Sprintf("node-%d", i))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		d.fail(err.Error())
	}
	log := filepath.Join(d.logs, fmt.Sprintf("node-%d.log", i))
	env := append(os.Environ(),
		fmt.Sprintf("DEMO_INSTANCE=node-%d", i),
		fmt.Sprintf("DEMO_PORT=%d", d.httpPort[i]),
		fmt.Sprintf("DEMO_ADMIN_PORT=%d", d.adminPort[i]),
		fmt.Sprintf("ETCD_ENDPOINTS=%s:%d", host, d.etcdPort),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
	p, err := fleet.StartProcess(fleet.ProcessSpec{
		Path:    caddyBin,
		Args:    []string{"run", "--config", d.config, "--adapter", "caddyfile"},
		Env:     env,
		LogPath: log,
	})
	if err != nil {
		d.fail(fmt.Sprintf("node-%d: %v", i, err))
	}
	d.mu.Lock()
	d.node[i] = p
	d.mu.Unlock()
	if err := p.WaitReady(15*time.Second, fleet.ListeningOn(fmt.Sprintf("%s:%d", host, d.httpPort[i]))); err != nil {
		name := fmt.Sprintf("node-%d", i)
		if !p.Running() {
			d.mu.Lock()
			d.node[i] = nil
			d.mu.Unlock()
			d.fail(fmt.Sprintf("%s exited at start; see %s", name, log), name)
		}
		d.fail(fmt.Sprintf("%s did not serve on %d within 15s; see %s", name, d.httpPort[i], log), name)
	}
}

func (d *demo) running(i int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.node[i] != nil && d.node[i].Running()
}

func (d *demo) pid(i int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.node[i].Pid()
}

// signalNode sends sig to node-i; reapNode waits for it to exit.
func (d *demo) signalNode(sig syscall.Signal, i int) {
	d.mu.Lock()
	p := d.node[i]
	d.mu.Unlock()
	if p != nil {
		_ = p.Signal(sig)
	}
}

// reapNode waits (up to 15s) for node-i to exit.
func (d *demo) reapNode(i int) {
	d.mu.Lock()
	p := d.node[i]
	d.mu.Unlock()
	if p != nil && !p.WaitExit(15*time.Second) {
		name := fmt.Sprintf("node-%d", i)
		d.fail(fmt.Sprintf("%s still runs 15s after it was told to stop; see %s", name, filepath.Join(d.logs, name+".log")), name)
	}
	d.mu.Lock()
	d.node[i] = nil
	d.mu.Unlock()
}

// others returns the running nodes other than i.
func (d *demo) others(i int) []int {
	var out []int
	for j := 1; j <= nodeCount; j++ {
		if j != i && d.running(j) {
			out = append(out, j)
		}
	}
	return out
}

// answer is one HTTP answer; status 0 means none came.
type answer struct {
	status          int
	location, retry string
	body            string // on one line
}

// code is the status as curl prints it: 000 when nothing answered.
func (a answer) code() string { return fmt.Sprintf("%03d", a.status) }

// request sends one request to node-i's HTTP port. Followers hold gated requests for up to
// `hold` (2s) before they answer, so it waits up to 5s.
func (d *demo) request(method string, i int, path string) answer {
	url := fmt.Sprintf("http://%s:%d%s", host, d.httpPort[i], path)
	resp, err := fleet.Send(context.Background(), d.client, method, url, nil, 5*time.Second)
	if err != nil {
		return answer{}
	}
	return answer{
		status:   resp.Status,
		location: resp.Header.Get("Location"),
		retry:    resp.Header.Get("Retry-After"),
		body:     strings.ReplaceAll(resp.Body, "\n", " "),
	}
}

// --- who leads -------------------------------------------------------------------------

// view is what node-i says of the election.
type view struct {
	role  string // leader, follower, stopped, no answer
	token string // the leader's token, on the leader
	knows string // the leader a follower names
}

var (
	tokenRE    = regexp.MustCompile(`token ([0-9]+)`)
	leaderIsRE = regexp.MustCompile(`leader is ([^ ]+) at`)
)

// poll asks every running node's /leader. It returns every node's view and the leading
// nodes.
func (d *demo) poll() ([nodeCount + 1]view, []int) {
	var views [nodeCount + 1]view
	var leaders []int
	for i := 1; i <= nodeCount; i++ {
		if !d.running(i) {
			views[i].role = "stopped"
			continue
		}
		a := d.request(http.MethodGet, i, "/leader")
		switch a.status {
		case http.StatusOK:
			views[i].role = "leader"
			leaders = append(leaders, i)
			if m := tokenRE.FindStringSubmatch(a.body); m != nil {
				views[i].token = m[1]
			}
		case http.StatusServiceUnavailable:
			views[i].role = "follower"
			if m := leaderIsRE.FindStringSubmatch(a.body); m != nil {
				views[i].knows = m[1]
			}
		default:
			views[i].role = "no answer"
		}
	}
	return views, leaders
}

// describe prints the picture that poll made, one line per node.
func (d *demo) describe(views [nodeCount + 1]view) {
	for i := 1; i <= nodeCount; i++ {
		line := fmt.Sprintf("node-%d  http://%s:%-5d ", i, host, d.httpPort[i])
		switch v := views[i]; v.role {
		case "leader":
			line += fmt.Sprintf("%sLEADER%s   token %s", d.green, d.reset, v.token)
		case "follower":
			knows := v.knows
			if knows == "" {
				knows = "none known"
			}
			line += fmt.Sprintf("follower (leader: %s)", knows)
		default:
			line += d.dim + v.role + d.reset
		}
		d.note(line)
	}
}

// summaryLine is the picture in one line, for watching changes.
func summaryLine(views [nodeCount + 1]view) string {
	var parts []string
	for i := 1; i <= nodeCount; i++ {
		if views[i].role == "leader" {
			parts = append(parts, fmt.Sprintf("node-%d LEADER (token %s)", i, views[i].token))
		} else {
			parts = append(parts, fmt.Sprintf("node-%d %s", i, views[i].role))
		}
	}
	return strings.Join(parts, "  ")
}

// waitLeader polls until exactly one node leads and every running follower names it, or
// within passes. It returns the leader (0 on timeout) and the last picture.
func (d *demo) waitLeader(within time.Duration) (int, [nodeCount + 1]view) {
	deadline := time.Now().Add(within)
	for {
		views, leaders := d.poll()
		if len(leaders) > 1 {
			d.bad(summaryLine(views)+": more than one instance leads", "node-1", "node-2", "node-3")
		}
		if len(leaders) == 1 {
			agreed := true
			for i := 1; i <= nodeCount; i++ {
				v := views[i]
				if v.role != "stopped" && v.role != "leader" && v.knows != fmt.Sprintf("node-%d", leaders[0]) {
					agreed = false
				}
			}
			if agreed {
				return leaders[0], views
			}
		}
		if !time.Now().Before(deadline) {
			return 0, views
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// timeTakeover polls /leader on candidates, pausing gap between rounds, until one answers
// 200 or within has passed since from. It returns that node (0 if none) and the time.
func (d *demo) timeTakeover(from time.Time, within, gap time.Duration, candidates []int) (int, time.Duration) {
	taker, took, _ := fleet.TimeTakeover(from, within, gap, candidates, func(i int) bool {
		return d.request(http.MethodGet, i, "/leader").status == http.StatusOK
	})
	return taker, took
}

func fmtMS(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1000 {
		return fmt.Sprintf("%d ms", ms)
	}
	return fmt.Sprintf("%d.%02d s (%d ms)", ms/1000, ms%1000/10, ms)
}
