#!/usr/bin/env bash
# Throughput and latency of a gated route against the same route without the gate, side by
# side in one Caddy process, measured with wrk on 127.0.0.1. See BENCHMARKS.md.
#
#   bench/throughput.sh                    # 3 alternating rounds of 10s per route, 2 threads, 50 connections
#   ROUNDS=5 DURATION=20s bench/throughput.sh
#   MODE=simultaneous bench/throughput.sh  # both routes at once, each with half the threads and connections
#   PROFILE=gated.pprof bench/throughput.sh  # also a CPU profile of Caddy under a gated round, with the gate's share
#   CONTROL=1 bench/throughput.sh          # A/A control: /gated without leader_gate, to see the noise
#
# On a machine that other work shares, alternating rounds see the load change between them;
# simultaneous rounds load both routes under the same conditions, so their ratio is steadier.
#
# It builds ./cmd/caddy and ./cmd/etcd-local into a temporary directory, installs wrk with
# apt-get if it is missing, starts one single-member etcd and one Caddy (the leader of its
# election), and stops both and removes the directory on exit, however it exits.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-2}
CONNECTIONS=${CONNECTIONS:-50}
WARMUP=${WARMUP:-3s}
MODE=${MODE:-alternating}
PROFILE=${PROFILE:-}
gate_directive=leader_gate
[[ ${CONTROL:-} != 1 ]] || gate_directive="# CONTROL=1: no leader_gate"
case $MODE in
alternating | simultaneous) ;;
*) echo "MODE must be alternating or simultaneous" >&2; exit 2 ;;
esac

pids=()
tmp=$(mktemp -d "${TMPDIR:-/tmp}/caddy-leader-throughput.XXXXXX")
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		# Caddy drains and resigns on SIGTERM within a few seconds; then it is killed.
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log() { printf '==> %s\n' "$*" >&2; }

if ! command -v wrk >/dev/null; then
	log "installing wrk"
	sudo=""
	[[ $(id -u) -eq 0 ]] || sudo=sudo
	$sudo apt-get update -qq
	$sudo apt-get install -y -qq wrk >/dev/null
fi

log "building caddy and etcd-local"
go build -o "$tmp/caddy" ./cmd/caddy
go build -o "$tmp/etcd-local" ./cmd/etcd-local

mapfile -t ports < <(go run ./bench/freeports -n 4)
etcd_port=${ports[0]} peer_port=${ports[1]} http_port=${ports[2]} admin_port=${ports[3]}

log "starting etcd-local on 127.0.0.1:$etcd_port"
"$tmp/etcd-local" -listen "127.0.0.1:$etcd_port" -peer "127.0.0.1:$peer_port" -data-dir "$tmp/etcd" >"$tmp/etcd.log" 2>&1 &
pids+=($!)
for i in $(seq 300); do
	curl -fsS "http://127.0.0.1:$etcd_port/health" >/dev/null 2>&1 && break
	[[ $i -lt 300 ]] || { cat "$tmp/etcd.log" >&2; echo "etcd did not become healthy" >&2; exit 1; }
	sleep 0.1
done

# Same response, same matcher cost on both routes: the only difference is leader_gate.
cat >"$tmp/Caddyfile" <<EOF
{
	admin 127.0.0.1:$admin_port
	persist_config off
	leader {
		endpoints 127.0.0.1:$etcd_port
		instance_id bench
		ttl 10s
	}
}

http://127.0.0.1:$http_port {
	handle /gated {
		$gate_directive
		respond "hello, world" 200
	}
	handle /plain {
		respond "hello, world" 200
	}
}
EOF

log "starting caddy on 127.0.0.1:$http_port"
HOME="$tmp/home" XDG_DATA_HOME="$tmp/home/data" XDG_CONFIG_HOME="$tmp/home/config" \
	"$tmp/caddy" run --adapter caddyfile --config "$tmp/Caddyfile" >"$tmp/caddy.log" 2>&1 &
pids+=($!)
for i in $(seq 300); do
	[[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/gated" 2>/dev/null) == 200 ]] && break
	[[ $i -lt 300 ]] || { tail -50 "$tmp/caddy.log" >&2; echo "caddy did not start leading within 30s" >&2; exit 1; }
	sleep 0.1
done
[[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http_port/plain") == 200 ]]

# run_wrk ROUTE DURATION [THREADS CONNECTIONS] prints: req/s p50_us p99_us non2xx socket_errors
run_wrk() {
	wrk -t"${3:-$THREADS}" -c"${4:-$CONNECTIONS}" -d"$2" --latency "http://127.0.0.1:$http_port/$1" | awk '
		function us(v) {
			if (v ~ /us$/) { sub(/us$/, "", v); return v + 0 }
			if (v ~ /ms$/) { sub(/ms$/, "", v); return v * 1000 }
			if (v ~ /s$/)  { sub(/s$/, "", v);  return v * 1000000 }
			return v + 0
		}
		/^ +50%/ { p50 = us($2) }
		/^ +99%/ { p99 = us($2) }
		/^Requests\/sec:/ { rps = $2 }
		/Non-2xx or 3xx responses:/ { bad = $NF }
		/Socket errors:/ { gsub(/,/, ""); errs = $4 + $6 + $8 + $10 }
		END { printf "%s %s %s %d %d\n", rps, p50, p99, bad, errs }'
}

log "warm-up: $WARMUP per route"
run_wrk plain "$WARMUP" >/dev/null
run_wrk gated "$WARMUP" >/dev/null

echo
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores, $(go version | cut -d' ' -f3-)"
if [[ $MODE == alternating ]]; then
	echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency, $ROUNDS rounds, routes in turn, order alternating"
else
	echo "wrk -t$((THREADS / 2 > 0 ? THREADS / 2 : 1)) -c$((CONNECTIONS / 2)) -d$DURATION --latency per route, $ROUNDS rounds, both routes at once"
fi
echo
printf '%-6s %-6s %12s %10s %10s %8s %8s\n' round route "req/s" "p50 (us)" "p99 (us)" non-2xx errors
results=()
for round in $(seq "$ROUNDS"); do
	order=(plain gated)
	((round % 2 == 0)) && order=(gated plain)
	if [[ $MODE == simultaneous ]]; then
		wrks=()
		for route in "${order[@]}"; do
			run_wrk "$route" "$DURATION" $((THREADS / 2 > 0 ? THREADS / 2 : 1)) $((CONNECTIONS / 2)) >"$tmp/wrk-$route" &
			wrks+=($!)
		done
		wait "${wrks[@]}" # not a bare wait: etcd and caddy are background jobs too
	fi
	for route in "${order[@]}"; do
		if [[ $MODE == simultaneous ]]; then
			read -r rps p50 p99 bad errs <"$tmp/wrk-$route"
		else
			read -r rps p50 p99 bad errs < <(run_wrk "$route" "$DURATION")
		fi
		printf '%-6s %-6s %12.0f %10.0f %10.0f %8d %8d\n' "$round" "$route" "$rps" "$p50" "$p99" "$bad" "$errs"
		results+=("$round $route $rps $p50 $p99 $bad $errs")
	done
done

echo
printf '%s\n' "${results[@]}" | awk '
	{ rps[$2] += $3; p50[$2] += $4; p99[$2] += $5; bad[$2] += $6 + $7; n[$2]++; r[$1 " " $2] = $3 }
	END {
		printf "%-6s %12s %14s %14s %8s\n", "route", "mean req/s", "mean p50 (us)", "mean p99 (us)", "failed"
		for (k in n) printf "%-6s %12.0f %14.0f %14.0f %8d\n", k, rps[k] / n[k], p50[k] / n[k], p99[k] / n[k], bad[k]
		printf "\ngated/plain throughput: %.3f (per round:", rps["gated"] / rps["plain"]
		for (i = 1; (i " plain") in r; i++) {
			ratio[i] = r[i " gated"] / r[i " plain"]
			printf " %.3f", ratio[i]
		}
		rounds = i - 1
		# median of the per-round ratios: each round measures both routes back to back
		for (i = 1; i <= rounds; i++) for (j = i + 1; j <= rounds; j++) if (ratio[j] < ratio[i]) { x = ratio[i]; ratio[i] = ratio[j]; ratio[j] = x }
		median = rounds % 2 ? ratio[(rounds + 1) / 2] : (ratio[rounds / 2] + ratio[rounds / 2 + 1]) / 2
		printf "; median of rounds %.3f)\n", median
		printf "gated-plain p99: %+.0f us, p50: %+.0f us\n", (p99["gated"] - p99["plain"]) / n["gated"], (p50["gated"] - p50["plain"]) / n["gated"]
		if (bad["gated"] + bad["plain"] > 0) { print "FAILED: some requests were not answered with 2xx"; exit 1 }
	}'

# The gate's share of Caddy's CPU under load, from Caddy's own profile (admin /debug/pprof):
# what the gate costs a real request, next to the noise of the req/s comparison above.
if [[ -n $PROFILE ]]; then
	secs=${DURATION%s}
	log "profiling caddy for ${secs}s under wrk on /gated"
	run_wrk gated "$((secs + 2))s" >/dev/null &
	wrk_pid=$!
	sleep 1
	curl -fsS -o "$PROFILE" "http://127.0.0.1:$admin_port/debug/pprof/profile?seconds=$secs"
	wait "$wrk_pid"
	echo
	echo "CPU profile of caddy under a gated round: $PROFILE"
	go tool pprof -top -cum -nodecount 1000 "$tmp/caddy" "$PROFILE" 2>/dev/null |
		grep -E 'Total samples|caddyhttp\.\(\*Server\)\.ServeHTTP$|caddy-leader\.\(\*Gate\)\.(ServeHTTP|serve|serveAdmitted)$|StaticResponse\)\.ServeHTTP$' || true
	echo "(the gate's own cost is its ServeHTTP minus the handler it calls next)"
fi
