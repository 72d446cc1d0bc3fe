package main

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// printCommands shows what to try by hand from another terminal.
func (d *demo) printCommands() {
	d.say("")
	d.say(d.bold + "Try it by hand" + d.reset + " (from another terminal; the pids change when an instance restarts):")
	for i := 1; i <= nodeCount; i++ {
		d.cmd(fmt.Sprintf("curl -i http://%s:%d/leader      # node-%d: 200 on the leader, 503 elsewhere", host, d.httpPort[i], i))
	}
	d.cmd(fmt.Sprintf("curl -i http://%s:%d/admin       # leader only; followers answer 503", host, d.httpPort[1]))
	if d.writeMode == "redirect" {
		d.cmd(fmt.Sprintf("curl -i -X POST http://%s:%d/write  # a follower redirects it to the leader", host, d.httpPort[2]))
		d.cmd(fmt.Sprintf("curl -iL -X POST http://%s:%d/write # -L follows it there", host, d.httpPort[3]))
	} else {
		d.cmd(fmt.Sprintf("curl -i -X POST http://%s:%d/write  # a follower forwards it to the leader", host, d.httpPort[2]))
	}
	for i := 1; i <= nodeCount; i++ {
		if d.running(i) {
			pid := d.pid(i)
			d.cmd(fmt.Sprintf("kill -TERM %d   # stop node-%d gracefully;  kill -KILL %d to crash it", pid, i, pid))
		}
	}
	d.cmd(fmt.Sprintf("./caddy leader status --address %s:%d   # node-1's view of the fleet", host, d.adminPort[1]))
	if d.pg != nil {
		d.cmd(fmt.Sprintf("%s/psql -h %s -p %d -U postgres -c 'TABLE caddy_leader_elections'   # the election row", d.pg.bin, host, d.pg.port))
	} else {
		d.cmd(fmt.Sprintf("etcdctl --endpoints %s:%d get --prefix /caddy-leader/   # the election key, if you have etcdctl", host, d.etcdPort))
	}
	d.note(fmt.Sprintf("Logs: %s/node-{1,2,3}.log and %s.log (%s); config: %s", d.logs, d.store, d.logsFate(), d.config))
}

// explore lets the user stop and start instances and watches who leads, until q, the end
// of input or Ctrl-C.
func (d *demo) explore() {
	d.checking = false
	d.printCommands()
	d.say("")
	if d.interactive {
		d.say(d.bold + "Or type here" + d.reset + ": t N (SIGTERM node-N), k N (SIGKILL node-N), s N (start node-N),")
		d.say("r (requests to every instance), q (quit). Leadership changes are printed as they happen.")
	} else {
		d.say("Leadership changes are printed as they happen; Ctrl-C stops everything.")
	}
	last := ""
	for {
		views, _ := d.poll()
		if line := summaryLine(views); line != last {
			fmt.Printf("  %s  %s\n", time.Now().Format("15:04:05"), line)
			last = line
		}
		if !d.interactive {
			time.Sleep(500 * time.Millisecond)
			continue
		}
		var input string
		select {
		case line, ok := <-d.lines():
			if !ok {
				return // end of input (Ctrl-D): as q
			}
			input = line
		case <-time.After(500 * time.Millisecond):
			continue // no input yet: poll again
		}
		if !d.command(input) {
			return
		}
	}
}

// command carries out one typed command; false means quit.
func (d *demo) command(input string) bool {
	f := strings.Fields(input)
	if len(f) == 0 {
		return true
	}
	what, arg := f[0], 0
	switch what {
	case "t", "k", "s":
		if len(f) < 2 {
			d.note(fmt.Sprintf("which instance? e.g. '%s 2'", what))
			return true
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 || n > nodeCount || f[1] != strconv.Itoa(n) {
			d.note(fmt.Sprintf("which instance? e.g. '%s 2'", what))
			return true
		}
		arg = n
	}
	switch what {
	case "q":
		return false
	case "r":
		if leader, views := d.waitLeader(0); leader != 0 {
			d.requests(leader)
		} else {
			d.note("no single leader right now: " + summaryLine(views))
		}
	case "t", "k":
		if !d.running(arg) {
			d.note(fmt.Sprintf("node-%d is not running", arg))
			return true
		}
		sig, name := syscall.SIGKILL, "KILL"
		if what == "t" {
			sig, name = syscall.SIGTERM, "TERM"
		}
		d.signalNode(sig, arg)
		d.note(fmt.Sprintf("sent SIG%s to node-%d", name, arg))
	case "s":
		if d.running(arg) {
			d.note(fmt.Sprintf("node-%d is already running", arg))
			return true
		}
		d.startNode(arg)
		d.note(fmt.Sprintf("started node-%d", arg))
	default:
		d.note(fmt.Sprintf("unknown command '%s': t N, k N, s N, r or q", what))
	}
	return true
}
