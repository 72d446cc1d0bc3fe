package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// run starts everything and walks through the steps, or goes straight to exploring.
func (d *demo) run() {
	d.say(fmt.Sprintf("%scaddy-leader demo%s: a local %s and three Caddy instances on %s, ttl %ds.", d.bold, d.reset, d.storeName(), host, int(d.ttl.Seconds())))
	d.note(fmt.Sprintf("config %s, temporary files in %s", d.config, d.tmp))
	d.startStore()
	for i := 1; i <= nodeCount; i++ {
		d.startNode(i)
		d.note(fmt.Sprintf("node-%d  http://%s:%d  admin %s:%d  (pid %d)  log %s",
			i, host, d.httpPort[i], host, d.adminPort[i], d.pid(i), d.logPath(i)))
	}
	d.note(fmt.Sprintf("status page: open http://%s:%d/leader-status/ in a browser (any instance's port)", host, d.httpPort[1]))
	if d.mode == manual {
		d.explore()
		return
	}
	d.walk()
	if d.mode == keep {
		d.explore()
	}
}

func (d *demo) logPath(i int) string {
	return filepath.Join(d.logs, fmt.Sprintf("node-%d.log", i))
}

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// walk is the walkthrough: election, requests, handover, crash, restart.
func (d *demo) walk() {
	ttlMS := d.ttl.Milliseconds()

	d.step("Elect a leader")
	leader, views := d.waitLeader(15 * time.Second)
	if leader == 0 {
		d.fail(fmt.Sprintf("no single leader that every instance names within 15s: %s", summaryLine(views)), d.store, "node-1", "node-2", "node-3")
	}
	d.describe(views)
	d.ok(fmt.Sprintf("exactly one leader, node-%d; both followers name it", leader))

	d.pause("send requests to all three")
	d.step("Requests to every instance")
	d.note(fmt.Sprintf("The leader serves every path. Followers serve /, answer 503 on /admin, and %s.", d.writeDoes))
	d.note("/leader is what a load balancer would health-check: 200 on the leader only.")
	d.requests(leader)
	d.ok("only the leader serves /admin and /write; followers answer 503 on /admin and " + d.writeDoes)

	d.pause("send requests to the rooms")
	d.step("Rooms: one owner per key")
	d.rooms()

	d.pause(fmt.Sprintf("stop the leader, node-%d, gracefully (SIGTERM)", leader))
	d.step("Graceful stop of the leader (SIGTERM)")
	old := leader
	rest := d.others(old)
	room := d.roomOf(old)
	if room == "" {
		d.fail(fmt.Sprintf("node-%d owns none of the rooms room-1 to room-40", old), nodeName(old))
	}
	d.note(fmt.Sprintf("node-%d also owns the shard of room %s: the room moves with the signal too.", old, room))
	d.note(fmt.Sprintf("kill -TERM %d   # node-%d: stops admitting, drains, then deletes its key", d.pid(old), old))
	d.note(fmt.Sprintf("Meanwhile, writes go to node-%d and node-%d without a pause.", rest[0], rest[1]))
	w := d.startWrites(rest[0], rest[1])
	time.Sleep(300 * time.Millisecond)
	t0 := time.Now()
	d.signalNode(syscall.SIGTERM, old)
	within := d.ttl + 2*time.Second
	taker, handover := d.timeTakeover(t0, within, 0, rest)
	time.Sleep(300 * time.Millisecond)
	ws := d.stopWrites(w)
	if taker == 0 {
		d.fail(fmt.Sprintf("no other instance led within %d ms of SIGTERM to node-%d", within.Milliseconds(), old), nodeName(old), nodeName(rest[0]), nodeName(rest[1]))
	}
	d.note(fmt.Sprintf("node-%d leads %s after the signal.", taker, fmtMS(handover)))
	d.note(fmt.Sprintf("Writes sent meanwhile: %d, answered 200: %d (accepted by %s).", ws.sent, ws.ok, orNobody(ws.by)))
	d.reapNode(old)
	leader, views = d.waitLeader(5 * time.Second)
	if leader != taker {
		d.fail(fmt.Sprintf("after the handover: %s; want node-%d alone leading", summaryLine(views), taker), nodeName(rest[0]), nodeName(rest[1]))
	}
	d.describe(views)
	if handover.Milliseconds() >= ttlMS {
		d.fail(fmt.Sprintf("the handover took %d ms, not less than the ttl (%d ms)", handover.Milliseconds(), ttlMS), nodeName(old), nodeName(taker))
	}
	d.ok(fmt.Sprintf("handover in %d ms (< ttl %d ms): the old leader deleted its key on the way out", handover.Milliseconds(), ttlMS))
	if owner, shard := d.agreedOwner(room, 5*time.Second); owner == "" || owner == nodeName(old) {
		d.fail(fmt.Sprintf("room %s did not move from node-%d to a running instance within 5s (owner %q)", room, old, owner), nodeName(rest[0]), nodeName(rest[1]))
	} else {
		d.ok(fmt.Sprintf("room %s (shard %s) moved to %s", room, shard, owner))
	}
	if d.writeMode == "forward" {
		if ws.ok != ws.sent || ws.sent == 0 {
			d.fail(fmt.Sprintf("%d of %d writes failed during the handover (%s); a follower should hold them for the new leader", ws.sent-ws.ok, ws.sent, ws.failed),
				nodeName(old), nodeName(rest[0]), nodeName(rest[1]))
		}
		d.ok(fmt.Sprintf("none of the %d writes failed: followers held them until node-%d led", ws.sent, taker))
	}

	d.pause(fmt.Sprintf("crash the new leader, node-%d (SIGKILL)", leader))
	d.step("Crash of the leader (SIGKILL)")
	crashed := leader
	rest = d.others(crashed)
	d.note(fmt.Sprintf("kill -KILL %d   # node-%d: no goodbye; its key lives until its lease expires (ttl %ds)", d.pid(crashed), crashed, int(d.ttl.Seconds())))
	w = d.startWrites(rest[0])
	time.Sleep(300 * time.Millisecond)
	t0 = time.Now()
	d.signalNode(syscall.SIGKILL, crashed)
	within = d.ttl + 3*time.Second
	taker, failover := d.timeTakeover(t0, within, 10*time.Millisecond, rest)
	time.Sleep(300 * time.Millisecond)
	ws = d.stopWrites(w)
	if taker == 0 {
		d.fail(fmt.Sprintf("no other instance led within %d ms of SIGKILL to node-%d", within.Milliseconds(), crashed), nodeName(crashed), nodeName(rest[0]), d.store)
	}
	d.note(fmt.Sprintf("node-%d leads %s after the crash.", taker, fmtMS(failover)))
	d.note(fmt.Sprintf("Writes sent to node-%d meanwhile: %d, answered 200: %d (accepted by %s).", rest[0], ws.sent, ws.ok, orNobody(ws.by)))
	if ws.ok < ws.sent {
		d.note("The others got 503 with Retry-After, after waiting up to the gate's hold (2s): until")
		d.note("the crashed leader's lease expires, nobody may take over.")
	}
	d.reapNode(crashed)
	leader, views = d.waitLeader(5 * time.Second)
	if leader != taker {
		d.fail(fmt.Sprintf("after the failover: %s; want node-%d alone leading", summaryLine(views), taker), nodeName(taker))
	}
	d.describe(views)
	d.ok(fmt.Sprintf("failover in %d ms (<= ttl + 3 s = %d ms)", failover.Milliseconds(), within.Milliseconds()))
	if d.writeMode != "reject" {
		a := d.request(http.MethodPost, rest[0], "/write")
		d.note(fmt.Sprintf("POST /write   node-%d -> %s  %s", rest[0], a.code(), a.body))
		if (a.status == 200 && strings.Contains(a.body, fmt.Sprintf("by node-%d ", taker))) || a.status == 307 || a.status == 308 {
			d.ok(fmt.Sprintf("writes are served again, by node-%d", taker))
		} else {
			d.fail(fmt.Sprintf("after the failover, POST /write on node-%d answered %s '%s'", rest[0], a.code(), a.body), nodeName(rest[0]))
		}
	}

	d.pause(fmt.Sprintf("restart node-%d and node-%d", old, crashed))
	d.step("Restart the stopped instances")
	for _, i := range []int{old, crashed} {
		d.startNode(i)
		d.note(fmt.Sprintf("node-%d started again (pid %d)", i, d.pid(i)))
	}
	leader, views = d.waitLeader(15 * time.Second)
	if leader != taker {
		d.fail(fmt.Sprintf("after the restart: %s; want node-%d still leading and both others following it", summaryLine(views), taker), nodeName(old), nodeName(crashed), nodeName(taker))
	}
	d.describe(views)
	d.ok(fmt.Sprintf("node-%d and node-%d rejoined as followers of node-%d", old, crashed, taker))

	d.say("")
	d.say(fmt.Sprintf("%sSummary%s: handover after SIGTERM %s; failover after SIGKILL %s (ttl %ds).", d.bold, d.reset, fmtMS(handover), fmtMS(failover), int(d.ttl.Seconds())))
	fmt.Printf("demo: %d passed, 0 failed\n", d.passed)
}

// requests sends GET /, GET /admin, POST /write and HEAD /leader to every running node and
// checks each answer against the leader's role.
func (d *demo) requests(leader int) {
	lurl := fmt.Sprintf("http://%s:%d", host, d.httpPort[leader])
	for i := 1; i <= nodeCount; i++ {
		if !d.running(i) {
			continue
		}
		name := nodeName(i)
		a := d.request(http.MethodGet, i, "/")
		d.note(fmt.Sprintf("GET  /        node-%d -> %s  %s", i, a.code(), a.body))
		want := fmt.Sprintf("leader is node-%d ", leader)
		if i == leader {
			want = fmt.Sprintf("node-%d, the leader ", leader)
		}
		if a.status != 200 || !strings.Contains(a.body, want) {
			d.bad(fmt.Sprintf("GET / on node-%d answered %s '%s'; want 200 naming node-%d as the leader", i, a.code(), a.body, leader), name)
		}

		a = d.request(http.MethodGet, i, "/admin")
		if i == leader {
			d.note(fmt.Sprintf("GET  /admin   node-%d -> %s  %s", i, a.code(), a.body))
			if a.status != 200 {
				d.bad(fmt.Sprintf("GET /admin on the leader node-%d answered %s '%s'; want 200", i, a.code(), a.body), name)
			}
		} else {
			retry := a.retry
			if retry == "" {
				retry = "none"
			}
			d.note(fmt.Sprintf("GET  /admin   node-%d -> %s  (Retry-After: %s) %s", i, a.code(), retry, a.body))
			if a.status != 503 || a.retry == "" {
				d.bad(fmt.Sprintf("GET /admin on the follower node-%d answered %s (Retry-After: '%s'); want 503 with Retry-After", i, a.code(), a.retry), name)
			}
		}

		a = d.request(http.MethodPost, i, "/write")
		redirect := a.status == 307 || a.status == 308
		switch {
		case redirect:
			d.note(fmt.Sprintf("POST /write   node-%d -> %s  redirect to %s", i, a.code(), a.location))
		case i != leader && a.status == 200:
			d.note(fmt.Sprintf("POST /write   node-%d -> %s  %s (forwarded)", i, a.code(), a.body))
		default:
			d.note(fmt.Sprintf("POST /write   node-%d -> %s  %s", i, a.code(), a.body))
		}
		byLeader := a.status == 200 && strings.Contains(a.body, fmt.Sprintf("by node-%d ", leader))
		if i == leader {
			if !byLeader {
				d.bad(fmt.Sprintf("POST /write on the leader node-%d answered %s '%s'; want 200", i, a.code(), a.body), name)
			}
		} else if !(redirect && a.location == lurl+"/write") && !byLeader {
			// A follower redirects the write to the leader, or forwards it there.
			d.bad(fmt.Sprintf("POST /write on the follower node-%d answered %s (Location: '%s') '%s'; want a redirect to %s/write or the leader's answer",
				i, a.code(), a.location, a.body, lurl), name)
		}

		a = d.request(http.MethodHead, i, "/leader")
		d.note(fmt.Sprintf("HEAD /leader  node-%d -> %s", i, a.code()))
		if i == leader && a.status != 200 {
			d.bad(fmt.Sprintf("HEAD /leader on the leader node-%d answered %s; want 200", i, a.code()), name)
		}
		if i != leader && a.status != 503 {
			d.bad(fmt.Sprintf("HEAD /leader on the follower node-%d answered %s; want 503", i, a.code()), name)
		}
	}
}
