// Command demo is the walkthrough behind `./xcaddy.sh demo`: one local etcd and three Caddy
// instances on 127.0.0.1, each serving demo/Caddyfile, then a graceful handover, a crash
// and a restart, each one timed and checked. xcaddy.sh builds ./caddy and ./etcd-local
// first and then runs it from the repository root; run it through xcaddy.sh.
//
// Everything it starts lives in one temporary directory (configs, data, logs) and is
// stopped and removed on exit, Ctrl-C included. Every wait is bounded.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const usage = `Usage: ./xcaddy.sh demo [--keep | --manual | --ci]

Starts a single-member etcd and three Caddy instances (node-1, node-2, node-3) on
127.0.0.1, each gating the site in demo/Caddyfile, then walks through:
  1. electing a leader          4. a crash of the new leader (SIGKILL), timed
  2. requests to all three      5. restarting both: they rejoin as followers
  3. a graceful stop of the leader (SIGTERM), timed
Ctrl-C stops everything it started and removes its temporary files.

Options:
  --keep    after the walkthrough, keep everything running and explore by hand
  --manual  skip the walkthrough: start everything and explore by hand
  --ci      no terminal needed: no prompts, no colors; check every step and exit
            non-zero, naming the step, if one fails

Environment:
  DEMO_PORT_BASE  first of the ports to use (default: 18080, or the next free block
                  of 100 above it): HTTP base..base+2, admin base+10..base+12,
                  etcd base+20 and base+21
  NO_COLOR        set to turn colors off
`

// mode is what the demo does once everything runs.
type mode int

const (
	walk   mode = iota // the walkthrough, then exit
	keep               // the walkthrough, then explore by hand
	manual             // explore by hand only
)

func main() {
	m, ci := walk, false
	for _, arg := range os.Args[1:] {
		switch arg {
		case "--ci":
			ci = true
		case "--keep":
			m = keep
		case "--manual":
			m = manual
		case "-h", "--help", "help":
			fmt.Print(usage)
			return
		default:
			fmt.Fprintf(os.Stderr, "demo: unknown option %q (see ./xcaddy.sh demo --help)\n", arg)
			os.Exit(2)
		}
	}
	if ci && m != walk {
		fmt.Fprintln(os.Stderr, "demo: --ci runs the walkthrough unattended; it does not go with --keep or --manual")
		os.Exit(2)
	}

	d := newDemo(m, ci)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	go func() {
		sig := <-signals
		switch sig {
		case syscall.SIGPIPE: // output gone (| head): still stop everything
			d.exit(141)
		case syscall.SIGTERM:
			d.interrupted(143)
		default:
			d.interrupted(130)
		}
	}()
	defer func() {
		if r := recover(); r != nil {
			// A failure nothing checks for is a bug in the demo; say where.
			d.internalError(r)
		}
	}()
	d.run()
	d.exit(0)
}
