// Command demo is the walkthrough behind `./xcaddy.sh demo`: one local etcd (or, with
// --store postgres, one local PostgreSQL server) and three Caddy instances on 127.0.0.1,
// each serving demo/Caddyfile, then rooms routed to the owner of their shard, a graceful
// handover that moves a room too, a crash and a restart, each one timed and checked. xcaddy.sh builds ./caddy and ./etcd-local first and then runs it from
// the repository root; run it through xcaddy.sh.
//
// Everything it starts lives in one temporary directory (configs, data, logs) and is
// stopped and removed on exit, Ctrl-C included; the logs are kept after a failure or with
// --keep-logs, and it says so where it prints their paths. Every wait is bounded.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

const usage = `Usage: ./xcaddy.sh demo [--keep | --manual | --ci] [--keep-logs] [--store etcd|postgres]

Starts a single-member etcd (or a PostgreSQL server) and three Caddy instances (node-1,
node-2, node-3) on 127.0.0.1, each gating the site in demo/Caddyfile, then walks through:
  1. electing a leader          4. a graceful stop of the leader (SIGTERM), timed,
  2. requests to all three         and one of its rooms moving to another owner
  3. rooms: a shard set of 8,   5. a crash of the new leader (SIGKILL), timed
     one owner per room         6. restarting both: they rejoin as followers
It prints the address of the status page to open in a browser.
Ctrl-C stops everything it started and removes its temporary files, the logs
included (after a failed step, or with --keep-logs, the logs are kept).

Options:
  --keep    after the walkthrough, keep everything running and explore by hand
  --manual  skip the walkthrough: start everything and explore by hand
  --ci      no terminal needed: no prompts, no colors; check every step and exit
            non-zero, naming the step, if one fails
  --keep-logs
            keep the logs (etcd or PostgreSQL, and each node's) when the demo exits;
            it says where
  --store postgres
            elect through PostgreSQL instead of etcd: a server of the installed
            PostgreSQL (initdb, pg_ctl; e.g. apt-get install postgresql) in the
            temporary directory, with demo/Caddyfile's endpoints replaced by
            'store postgres { dsn ... }' (see docs/postgres.md)

Environment:
  DEMO_PORT_BASE  first of the ports to use (default: 18080, or the next free block
                  of 100 above it): HTTP base..base+2, admin base+10..base+12,
                  etcd base+20 and base+21 (PostgreSQL base+20)
  NO_COLOR        set to turn colors off
`

// mode is what the demo does once everything runs.
type mode int

const (
	walk   mode = iota // the walkthrough, then exit
	keep               // the walkthrough, then explore by hand
	manual             // explore by hand only
)

// options is what the command line asks for.
type options struct {
	mode  mode
	ci    bool
	store string // etcd or postgres
	help  bool
	// keepLogs keeps the logs on exit, not only after a failure.
	keepLogs bool
}

// parseArgs reads the command line (without the program's name); the error is the message
// to print before exiting with status 2.
func parseArgs(args []string) (options, error) {
	o := options{mode: walk, store: "etcd"}
	for len(args) > 0 {
		arg := args[0]
		args = args[1:]
		if v, ok := strings.CutPrefix(arg, "--store="); ok {
			arg, args = "--store", append([]string{v}, args...)
		}
		switch arg {
		case "--store":
			if len(args) == 0 {
				return o, fmt.Errorf("--store needs a value: etcd or postgres")
			}
			o.store, args = args[0], args[1:]
			if o.store != "etcd" && o.store != "postgres" {
				return o, fmt.Errorf("--store %q: use etcd or postgres", o.store)
			}
		case "--ci":
			o.ci = true
		case "--keep":
			o.mode = keep
		case "--manual":
			o.mode = manual
		case "--keep-logs":
			o.keepLogs = true
		case "-h", "--help", "help":
			o.help = true
			return o, nil
		default:
			return o, fmt.Errorf("unknown option %q (see ./xcaddy.sh demo --help)", arg)
		}
	}
	if o.ci && o.mode != walk {
		return o, fmt.Errorf("--ci runs the walkthrough unattended; it does not go with --keep or --manual")
	}
	return o, nil
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(2)
	}
	if o.help {
		fmt.Print(usage)
		return
	}

	d := newDemo(o.mode, o.ci, o.store)
	d.keepLogs = o.keepLogs
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
