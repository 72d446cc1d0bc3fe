#!/usr/bin/env bash
# The walkthrough behind `./xcaddy.sh demo`: one local etcd and three Caddy instances on
# 127.0.0.1, each serving demo/Caddyfile, then a graceful handover, a crash and a restart,
# each one timed and checked. xcaddy.sh builds ./caddy and ./etcd-local first and then runs
# this script; run it through xcaddy.sh.
#
# Everything it starts lives in one temporary directory (configs, data, logs) and is stopped
# and removed on exit, Ctrl-C included. Requests go over bash's /dev/tcp, so it needs no
# curl. Every wait is bounded.
set -Eeuo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
	cat <<'EOF'
Usage: ./xcaddy.sh demo [--keep | --manual | --ci]

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
EOF
}

# --- options ---------------------------------------------------------------------------

mode=walk # walk, keep, manual
ci=false
while (($# > 0)); do
	case $1 in
	--ci) ci=true ;;
	--keep) mode=keep ;;
	--manual) mode=manual ;;
	-h | --help | help)
		usage
		exit 0
		;;
	*)
		printf 'demo: unknown option %q (see ./xcaddy.sh demo --help)\n' "$1" >&2
		exit 2
		;;
	esac
	shift
done
if $ci && [[ $mode != walk ]]; then
	echo "demo: --ci runs the walkthrough unattended; it does not go with --keep or --manual" >&2
	exit 2
fi

# --- output ----------------------------------------------------------------------------

die() {
	printf 'demo: %s\n' "$*" >&2
	exit 1
}

((BASH_VERSINFO[0] > 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] >= 3))) ||
	die "needs bash 4.3 or later, this is $BASH_VERSION (on macOS: brew install bash)"
[[ -x ./caddy && -x ./etcd-local ]] || die "./caddy or ./etcd-local is missing: run it as ./xcaddy.sh demo, which builds them"

bold='' green='' red='' dim='' reset=''
if ! $ci && [[ -t 1 && -z ${NO_COLOR:-} ]]; then
	bold=$'\e[1m' green=$'\e[32m' red=$'\e[31m' dim=$'\e[2m' reset=$'\e[0m'
fi

# Prompts wait for Enter only where someone can press it.
interactive=false
if ! $ci && [[ -t 0 && -t 1 ]]; then
	interactive=true
fi

say() { printf '%s\n' "$*"; }
note() { printf '  %s\n' "$*"; }
cmd() { printf '    %s%s%s\n' "$dim" "$*" "$reset"; }
ok() {
	printf '  %sok%s: %s\n' "$green" "$reset" "$*"
	passed=$((passed + 1))
}

step_no=0
step_name=''
step() {
	step_no=$((step_no + 1))
	step_name=$1
	printf '\n%s==> %d. %s%s\n' "$bold" "$step_no" "$1" "$reset"
}

pause() {
	if $interactive && [[ $mode != manual ]]; then
		printf '\n%sPress Enter to %s (Ctrl-C stops the demo)%s ' "$dim" "$1" "$reset"
		read -r _ || true
	fi
}

# now is the wall clock in milliseconds (bash 5's EPOCHREALTIME, or date).
now=0
now_ms() {
	if [[ -n ${EPOCHREALTIME:-} ]]; then
		local t=${EPOCHREALTIME//[.,]/}
		now=$((10#$t / 1000))
	else
		now=$(date +%s%3N)
		[[ $now =~ ^[0-9]+$ ]] || now=$(($(date +%s) * 1000))
	fi
}

# --- ports, files ----------------------------------------------------------------------

readonly nodes=(1 2 3)
readonly host=127.0.0.1

# The ttl is read from demo/Caddyfile so that the checks follow the config.
ttl_s=$(awk '$1 == "ttl" { sub(/s$/, "", $2); print $2; exit }' demo/Caddyfile)
[[ $ttl_s =~ ^[0-9]+$ ]] || die "demo/Caddyfile: cannot read a ttl in whole seconds (like 'ttl 3s') from it"
readonly ttl_ms=$((ttl_s * 1000))

# What a follower does with /write (the first `follower` line in demo/Caddyfile): the
# texts below say forward or redirect accordingly.
write_mode=$(awk '$1 == "follower" { print $2; exit }' demo/Caddyfile)
case $write_mode in
forward) write_does="forward writes to the leader" ;;
redirect) write_does="redirect writes to the leader" ;;
*) write_does="answer 503 on /write" ;;
esac

# True when something accepts connections on 127.0.0.1:port.
listening() {
	(exec 3<>"/dev/tcp/$host/$1") 2>/dev/null
}

ports_of() {
	local base=$1
	http_port=([1]=$base [2]=$((base + 1)) [3]=$((base + 2)))
	admin_port=([1]=$((base + 10)) [2]=$((base + 11)) [3]=$((base + 12)))
	etcd_port=$((base + 20))
	etcd_peer_port=$((base + 21))
}

# Names the first port of the block at base that is in use, if any.
busy_port() {
	local base=$1 p
	ports_of "$base"
	for p in "${http_port[@]}" "${admin_port[@]}" "$etcd_port" "$etcd_peer_port"; do
		if listening "$p"; then
			busy=$p
			return 0
		fi
	done
	return 1
}

declare -a http_port admin_port
busy=''
if [[ -n ${DEMO_PORT_BASE:-} ]]; then
	if ! [[ $DEMO_PORT_BASE =~ ^[0-9]+$ ]] || ((DEMO_PORT_BASE < 1024 || DEMO_PORT_BASE > 65500)); then
		die "DEMO_PORT_BASE=$DEMO_PORT_BASE is not a port number between 1024 and 65500"
	fi
	if busy_port "$DEMO_PORT_BASE"; then
		die "port $busy is in use (DEMO_PORT_BASE=$DEMO_PORT_BASE needs $DEMO_PORT_BASE-$((DEMO_PORT_BASE + 2)), $((DEMO_PORT_BASE + 10))-$((DEMO_PORT_BASE + 12)), $((DEMO_PORT_BASE + 20))-$((DEMO_PORT_BASE + 21))): stop what uses it or pick another DEMO_PORT_BASE"
	fi
	port_base=$DEMO_PORT_BASE
else
	port_base=''
	for base in 18080 18180 18280 18380 18480 18580; do
		if ! busy_port "$base"; then
			port_base=$base
			break
		fi
		first_busy=${first_busy:-$busy}
	done
	[[ -n $port_base ]] || die "ports from 18080 to 18601 are in use (e.g. $first_busy): set DEMO_PORT_BASE to a free block, like DEMO_PORT_BASE=28080"
	if [[ $port_base != 18080 ]]; then
		say "Port $first_busy is in use, so the demo uses ports from $port_base (set DEMO_PORT_BASE to choose)."
	fi
fi
ports_of "$port_base"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/caddy-leader-demo.XXXXXX") || die "cannot create a temporary directory"
logs=$tmp/logs
mkdir -p "$logs"

declare -a pid=([1]='' [2]='' [3]='')
etcd_pid=''
writer_pid=''
passed=0
failed=false

# --- stopping everything ---------------------------------------------------------------

# Stops the given pids: SIGTERM, up to 10s to exit, then SIGKILL. They are disowned
# children, which bash still reaps, so kill -0 tells when they are gone.
stop_pids() {
	local p alive deadline
	for p in "$@"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	now_ms
	deadline=$((now + 10000))
	while :; do
		alive=()
		for p in "$@"; do
			if kill -0 "$p" 2>/dev/null; then
				alive+=("$p")
			fi
		done
		((${#alive[@]} > 0)) || break
		now_ms
		if ((now > deadline)); then
			kill -KILL "${alive[@]}" 2>/dev/null || true
			break
		fi
		sleep 0.05
	done
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM ERR
	trap '' PIPE # output gone (| head): still stop everything
	local pids=() i
	for i in "${nodes[@]}"; do
		[[ -z ${pid[i]} ]] || pids+=("${pid[i]}")
	done
	[[ -z $writer_pid ]] || kill "$writer_pid" 2>/dev/null || true
	((${#pids[@]} == 0)) || stop_pids "${pids[@]}"
	[[ -z $etcd_pid ]] || stop_pids "$etcd_pid"
	if $failed; then
		rm -rf "$tmp/etcd" "$tmp"/node-*
		printf 'demo: the logs are kept in %s (remove it when done)\n' "$logs" >&2
	else
		rm -rf "$tmp"
	fi
	exit "$rc"
}

interrupted() {
	printf '\n%s\n' "demo: interrupted; stopping everything it started and removing $tmp"
	exit "${1:-130}"
}

# A command that fails where nothing checks it is a bug in this script; say where.
internal_error() {
	failed=true
	printf 'demo: internal error at demo/demo.sh line %s (step %d, %s); please report it\n' "$1" "$step_no" "${step_name:-starting}" >&2
}

trap cleanup EXIT
trap interrupted INT
trap 'interrupted 143' TERM
trap 'exit 141' PIPE
trap 'internal_error $LINENO' ERR

# Prints the last lines of the named logs (node-1, etcd, ...) with their paths.
show_logs() {
	local name
	for name in "$@"; do
		printf '  --- last lines of %s ---\n' "$logs/$name.log" >&2
		tail -n 12 "$logs/$name.log" 2>/dev/null | cut -c1-400 | sed 's/^/  | /' >&2 || true
	done
}

# fail MESSAGE [LOG...]: the step failed; says which, shows the logs, exits 1.
fail() {
	local msg=$1
	shift
	failed=true
	printf '\n%sdemo: FAILED at step %d (%s): %s%s\n' "$red" "$step_no" "$step_name" "$msg" "$reset" >&2
	(($# == 0)) || show_logs "$@"
	printf 'demo: %d passed, 1 failed\n' "$passed" >&2
	exit 1
}

# bad is fail during the walkthrough; while the user explores by hand it only says so.
checking=true
bad() {
	if $checking; then
		fail "$@"
	fi
	note "${red}unexpected${reset}: $1"
}

# --- HTTP over /dev/tcp ----------------------------------------------------------------

# One request, in a subshell; prints status, Location, Retry-After and the body (on one
# line), separated by \x1f. Each read gives up after 5s: a follower may hold a request for
# up to `hold` (2s) before it answers.
_http() {
	local method=$1 port=$2 path=$3 line status location='' retry='' body=''
	exec 3<>"/dev/tcp/$host/$port" || return 1
	printf '%s %s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: caddy-leader-demo\r\nContent-Length: 0\r\nConnection: close\r\n\r\n' \
		"$method" "$path" "$host" "$port" >&3
	IFS= read -r -t 5 line <&3 || return 1
	line=${line%$'\r'}
	status=${line#* }
	status=${status%% *}
	while IFS= read -r -t 5 line <&3; do
		line=${line%$'\r'}
		[[ -n $line ]] || break
		case ${line,,} in
		location:*) location=${line#*:} location=${location# } ;;
		retry-after:*) retry=${line#*:} retry=${retry# } ;;
		esac
	done
	IFS= read -r -d '' -t 5 body <&3 || true
	body=${body//$'\n'/ }
	printf '%s\x1f%s\x1f%s\x1f%s' "$status" "$location" "$retry" "$body"
}

# http METHOD PORT PATH sets res_status (000 if nothing answered), res_location,
# res_retry and res_body.
http() {
	local out
	out=$(_http "$@" 2>/dev/null) || out=''
	res_status='' res_location='' res_retry='' res_body=''
	IFS=$'\x1f' read -r res_status res_location res_retry res_body <<<"$out" || true
	[[ $res_status =~ ^[0-9]{3}$ ]] || res_status=000
}

# --- the instances ---------------------------------------------------------------------

running() {
	[[ -n ${pid[$1]} ]] && kill -0 "${pid[$1]}" 2>/dev/null
}

# start_node N: starts node-N in the background; returns once it serves HTTP.
start_node() {
	local i=$1 deadline
	mkdir -p "$tmp/node-$i"
	DEMO_INSTANCE=node-$i DEMO_PORT=${http_port[i]} DEMO_ADMIN_PORT=${admin_port[i]} \
		ETCD_ENDPOINTS=$host:$etcd_port \
		XDG_CONFIG_HOME=$tmp/node-$i/config XDG_DATA_HOME=$tmp/node-$i/data \
		./caddy run --config demo/Caddyfile --adapter caddyfile >>"$logs/node-$i.log" 2>&1 &
	pid[i]=$!
	disown "${pid[i]}" # no "Killed" line from bash when the demo crashes it on purpose
	now_ms
	deadline=$((now + 15000))
	until listening "${http_port[i]}"; do
		if ! running "$i"; then
			pid[i]=''
			fail "node-$i exited at start; see $logs/node-$i.log" "node-$i"
		fi
		now_ms
		((now < deadline)) || fail "node-$i did not serve on ${http_port[i]} within 15s; see $logs/node-$i.log" "node-$i"
		sleep 0.05
	done
}

start_etcd() {
	local deadline
	./etcd-local -listen "$host:$etcd_port" -peer "$host:$etcd_peer_port" -data-dir "$tmp/etcd" >"$logs/etcd.log" 2>&1 &
	etcd_pid=$!
	disown "$etcd_pid"
	now_ms
	deadline=$((now + 20000))
	until listening "$etcd_port"; do
		if ! kill -0 "$etcd_pid" 2>/dev/null; then
			etcd_pid=''
			fail "etcd exited at start; see $logs/etcd.log" etcd
		fi
		now_ms
		((now < deadline)) || fail "etcd did not listen on $etcd_port within 20s; see $logs/etcd.log" etcd
		sleep 0.05
	done
}

# signal_node SIG N sends SIG to node-N; the caller reaps it with reap_node.
signal_node() {
	kill "-$1" "${pid[$2]}" 2>/dev/null || true
}

# reap_node N waits (up to 15s) for node-N to exit.
reap_node() {
	local i=$1 deadline
	now_ms
	deadline=$((now + 15000))
	while running "$i"; do
		now_ms
		if ((now > deadline)); then
			fail "node-$i still runs 15s after it was told to stop; see $logs/node-$i.log" "node-$i"
		fi
		sleep 0.05
	done
	pid[i]=''
}

# --- who leads -------------------------------------------------------------------------

# poll asks every running node's /leader. Sets role[N] (leader, follower, stopped, no
# answer), token[N], knows[N] (the leader a follower names) and leaders (the leading nodes).
declare -a role token knows
leaders=()
poll() {
	local i
	leaders=()
	for i in "${nodes[@]}"; do
		token[i]='' knows[i]=''
		if ! running "$i"; then
			role[i]=stopped
			continue
		fi
		http GET "${http_port[i]}" /leader
		case $res_status in
		200)
			role[i]=leader
			leaders+=("$i")
			if [[ $res_body =~ token\ ([0-9]+) ]]; then
				token[i]=${BASH_REMATCH[1]}
			fi
			;;
		503)
			role[i]=follower
			if [[ $res_body =~ leader\ is\ ([^ ]+)\ at ]]; then
				knows[i]=${BASH_REMATCH[1]}
			fi
			;;
		*) role[i]="no answer" ;;
		esac
	done
}

# describe prints the picture that poll made, one line per node.
describe() {
	local i line
	for i in "${nodes[@]}"; do
		line=$(printf 'node-%d  http://%s:%-5d ' "$i" "$host" "${http_port[i]}")
		case ${role[i]} in
		leader) line+="${green}LEADER${reset}   token ${token[i]}" ;;
		follower) line+="follower (leader: ${knows[i]:-none known})" ;;
		*) line+="${dim}${role[i]}${reset}" ;;
		esac
		note "$line"
	done
}

# summary_line is the picture in one line, for watching changes.
summary_line() {
	local i s=''
	for i in "${nodes[@]}"; do
		case ${role[i]} in
		leader) s+="node-$i LEADER (token ${token[i]})  " ;;
		*) s+="node-$i ${role[i]}  " ;;
		esac
	done
	printf '%s' "${s%  }"
}

# wait_leader MS: polls until exactly one node leads and every running follower names it,
# or MS pass. Sets leader to its number (empty on timeout).
wait_leader() {
	local deadline i agreed
	now_ms
	deadline=$((now + $1))
	leader=''
	while :; do
		poll
		if ((${#leaders[@]} > 1)); then
			bad "$(summary_line): more than one instance leads" node-1 node-2 node-3
		fi
		if ((${#leaders[@]} == 1)); then
			agreed=true
			for i in "${nodes[@]}"; do
				[[ ${role[i]} == stopped || ${role[i]} == leader || ${knows[i]} == "node-${leaders[0]}" ]] || agreed=false
			done
			if $agreed; then
				leader=${leaders[0]}
				return 0
			fi
		fi
		now_ms
		((now < deadline)) || return 0
		sleep 0.05
	done
}

# time_takeover FROM_MS MAX_MS GAP OTHERS...: polls /leader on the OTHERS, sleeping GAP
# seconds between rounds, until one answers 200. Sets taker (empty if none did within
# MAX_MS) and took_ms.
time_takeover() {
	local from=$1 max=$2 gap=$3 i
	shift 3
	taker=''
	while :; do
		for i in "$@"; do
			http GET "${http_port[i]}" /leader
			if [[ $res_status == 200 ]]; then
				now_ms
				taker=$i
				took_ms=$((now - from))
				return 0
			fi
		done
		now_ms
		if ((now - from > max)); then
			took_ms=$((now - from))
			return 0
		fi
		[[ $gap == 0 ]] || sleep "$gap"
	done
}

# start_writes FILE PORT...: in the background, sends POST /write to the ports in turn
# until FILE.stop exists (10s at most), and writes one line per answer to FILE: the status
# and the body.
start_writes() {
	local file=$1
	shift
	: >"$file"
	(
		trap - INT TERM EXIT ERR
		ports=("$@")
		n=0
		now_ms
		deadline=$((now + 10000))
		while [[ ! -e $file.stop ]] && ((now < deadline)); do
			http POST "${ports[n % ${#ports[@]}]}" /write
			printf '%s %s\n' "$res_status" "$res_body" >>"$file"
			n=$((n + 1))
			now_ms
		done
	) &
	writer_pid=$!
	disown "$writer_pid"
}

# stop_writes FILE ends start_writes and sums FILE up: writes_sent, writes_ok (200) and
# writes_by (who accepted them, in order, e.g. "node-1 node-3").
stop_writes() {
	local file=$1 deadline
	: >"$file.stop"
	now_ms
	deadline=$((now + 12000)) # the request in flight: hold, then the 5s read timeout
	while kill -0 "$writer_pid" 2>/dev/null && ((now < deadline)); do
		sleep 0.02
		now_ms
	done
	kill "$writer_pid" 2>/dev/null || true
	writer_pid=''
	writes_sent=$(wc -l <"$file")
	writes_ok=$(grep -c '^200 ' "$file" || true)
	writes_by=$(sed -n 's/^200 .*accepted by \(node-[0-9]*\).*/\1/p' "$file" | uniq | tr '\n' ' ')
	writes_by=${writes_by% }
	writes_failed=$(grep -v '^200 ' "$file" | cut -c1-120 | sort | uniq -c | sed 's/^ *//' | head -3 | tr '\n' ';' || true)
}

others() {
	local i out=()
	for i in "${nodes[@]}"; do
		[[ $i == "$1" ]] || ! running "$i" || out+=("$i")
	done
	printf '%s\n' "${out[@]}"
}

fmt_ms() {
	if (($1 < 1000)); then
		printf '%d ms' "$1"
	else
		printf '%d.%02d s (%d ms)' $(($1 / 1000)) $(($1 % 1000 / 10)) "$1"
	fi
}

# --- steps -----------------------------------------------------------------------------

requests() {
	local i L=$leader lurl="http://$host:${http_port[$leader]}"
	for i in "${nodes[@]}"; do
		running "$i" || continue
		http GET "${http_port[i]}" /
		note "$(printf 'GET  /        node-%d -> %s  %s' "$i" "$res_status" "$res_body")"
		local want="leader is node-$L "
		[[ $i != "$L" ]] || want="node-$L, the leader "
		[[ $res_status == 200 && $res_body == *"$want"* ]] ||
			bad "GET / on node-$i answered $res_status '$res_body'; want 200 naming node-$L as the leader" "node-$i"

		http GET "${http_port[i]}" /admin
		if [[ $i == "$L" ]]; then
			note "$(printf 'GET  /admin   node-%d -> %s  %s' "$i" "$res_status" "$res_body")"
			[[ $res_status == 200 ]] || bad "GET /admin on the leader node-$i answered $res_status '$res_body'; want 200" "node-$i"
		else
			note "$(printf 'GET  /admin   node-%d -> %s  (Retry-After: %s) %s' "$i" "$res_status" "${res_retry:-none}" "$res_body")"
			[[ $res_status == 503 && -n $res_retry ]] ||
				bad "GET /admin on the follower node-$i answered $res_status (Retry-After: '${res_retry}'); want 503 with Retry-After" "node-$i"
		fi

		http POST "${http_port[i]}" /write
		if [[ $res_status == 307 || $res_status == 308 ]]; then
			note "$(printf 'POST /write   node-%d -> %s  redirect to %s' "$i" "$res_status" "$res_location")"
		elif [[ $i != "$L" && $res_status == 200 ]]; then
			note "$(printf 'POST /write   node-%d -> %s  %s (forwarded)' "$i" "$res_status" "$res_body")"
		else
			note "$(printf 'POST /write   node-%d -> %s  %s' "$i" "$res_status" "$res_body")"
		fi
		if [[ $i == "$L" ]]; then
			[[ $res_status == 200 && $res_body == *"by node-$L "* ]] ||
				bad "POST /write on the leader node-$i answered $res_status '$res_body'; want 200" "node-$i"
		else
			# A follower redirects the write to the leader, or forwards it there.
			[[ ($res_status == 307 || $res_status == 308) && $res_location == "$lurl/write" ]] ||
				[[ $res_status == 200 && $res_body == *"by node-$L "* ]] ||
				bad "POST /write on the follower node-$i answered $res_status (Location: '$res_location') '$res_body'; want a redirect to $lurl/write or the leader's answer" "node-$i"
		fi

		http HEAD "${http_port[i]}" /leader
		note "$(printf 'HEAD /leader  node-%d -> %s' "$i" "$res_status")"
		if [[ $i == "$L" ]]; then
			[[ $res_status == 200 ]] || bad "HEAD /leader on the leader node-$i answered $res_status; want 200" "node-$i"
		else
			[[ $res_status == 503 ]] || bad "HEAD /leader on the follower node-$i answered $res_status; want 503" "node-$i"
		fi
	done
}

print_commands() {
	local i
	say ""
	say "${bold}Try it by hand${reset} (from another terminal; the pids change when an instance restarts):"
	for i in "${nodes[@]}"; do
		cmd "curl -i http://$host:${http_port[i]}/leader      # node-$i: 200 on the leader, 503 elsewhere"
	done
	cmd "curl -i http://$host:${http_port[1]}/admin       # leader only; followers answer 503"
	if [[ $write_mode == redirect ]]; then
		cmd "curl -i -X POST http://$host:${http_port[2]}/write  # a follower redirects it to the leader"
		cmd "curl -iL -X POST http://$host:${http_port[3]}/write # -L follows it there"
	else
		cmd "curl -i -X POST http://$host:${http_port[2]}/write  # a follower forwards it to the leader"
	fi
	for i in "${nodes[@]}"; do
		if running "$i"; then
			cmd "kill -TERM ${pid[i]}   # stop node-$i gracefully;  kill -KILL ${pid[i]} to crash it"
		fi
	done
	cmd "curl -s http://$host:${admin_port[1]}/leader/   # node-1's view, from Caddy's admin API"
	cmd "etcdctl --endpoints $host:$etcd_port get --prefix /caddy-leader/   # the election key, if you have etcdctl"
	note "Logs: $logs/node-{1,2,3}.log and etcd.log; config: demo/Caddyfile"
}

# explore lets the user stop and start instances and watches who leads, until Ctrl-C.
explore() {
	local line last='' arg i
	checking=false
	print_commands
	say ""
	if $interactive; then
		say "${bold}Or type here${reset}: t N (SIGTERM node-N), k N (SIGKILL node-N), s N (start node-N),"
		say "r (requests to every instance), q (quit). Leadership changes are printed as they happen."
	else
		say "Leadership changes are printed as they happen; Ctrl-C stops everything."
	fi
	while :; do
		poll
		line=$(summary_line)
		if [[ $line != "$last" ]]; then
			printf '  %(%H:%M:%S)T  %s\n' -1 "$line"
			last=$line
		fi
		if ! $interactive; then
			sleep 0.5
			continue
		fi
		local rc=0
		IFS= read -r -t 0.5 line || rc=$?
		if ((rc > 128)); then
			continue # no input yet: poll again
		elif ((rc != 0)); then
			return 0 # end of input (Ctrl-D): as q
		fi
		read -r line arg _ <<<"$line" || true
		case $line in
		t | k | s)
			if ! [[ ${arg:-} =~ ^[123]$ ]]; then
				note "which instance? e.g. '$line 2'"
				continue
			fi
			;;
		esac
		case $line in
		'') ;;
		q) return 0 ;;
		r)
			wait_leader 0
			if [[ -n $leader ]]; then
				requests
			else
				note "no single leader right now: $(summary_line)"
			fi
			;;
		t | k)
			if ! running "$arg"; then
				note "node-$arg is not running"
				continue
			fi
			local sig=KILL
			[[ $line == k ]] || sig=TERM
			signal_node "$sig" "$arg"
			note "sent SIG$sig to node-$arg"
			;;
		s)
			if running "$arg"; then
				note "node-$arg is already running"
				continue
			fi
			start_node "$arg"
			note "started node-$arg"
			;;
		*) note "unknown command '$line': t N, k N, s N, r or q" ;;
		esac
	done
}

# --- the walkthrough -------------------------------------------------------------------

say "${bold}caddy-leader demo${reset}: a local etcd and three Caddy instances on $host, ttl ${ttl_s}s."
note "config demo/Caddyfile, temporary files in $tmp"
start_etcd
note "etcd    $host:$etcd_port  (pid $etcd_pid)"
for i in "${nodes[@]}"; do
	start_node "$i"
	note "node-$i  http://$host:${http_port[i]}  admin $host:${admin_port[i]}  (pid ${pid[i]})  log $logs/node-$i.log"
done

if [[ $mode == manual ]]; then
	explore
	exit 0
fi

step "Elect a leader"
wait_leader 15000
[[ -n $leader ]] || fail "no single leader that every instance names within 15s: $(summary_line)" etcd node-1 node-2 node-3
describe
ok "exactly one leader, node-$leader; both followers name it"

pause "send requests to all three"
step "Requests to every instance"
note "The leader serves every path. Followers serve /, answer 503 on /admin, and $write_does."
note "/leader is what a load balancer would health-check: 200 on the leader only."
requests
ok "only the leader serves /admin and /write; followers answer 503 on /admin and $write_does"

pause "stop the leader, node-$leader, gracefully (SIGTERM)"
step "Graceful stop of the leader (SIGTERM)"
old=$leader
mapfile -t rest < <(others "$old")
note "kill -TERM ${pid[old]}   # node-$old: stops admitting, drains, then deletes its key"
note "Meanwhile, writes go to node-${rest[0]} and node-${rest[1]} without a pause."
start_writes "$tmp/writes-handover" "${http_port[rest[0]]}" "${http_port[rest[1]]}"
sleep 0.3
now_ms
t0=$now
signal_node TERM "$old"
time_takeover "$t0" $((ttl_ms + 2000)) 0 "${rest[@]}"
sleep 0.3
stop_writes "$tmp/writes-handover"
[[ -n $taker ]] || fail "no other instance led within $((ttl_ms + 2000)) ms of SIGTERM to node-$old" "node-$old" "node-${rest[0]}" "node-${rest[1]}"
handover_ms=$took_ms
note "node-$taker leads $(fmt_ms "$handover_ms") after the signal."
note "Writes sent meanwhile: $writes_sent, answered 200: $writes_ok (accepted by ${writes_by:-nobody})."
reap_node "$old"
wait_leader 5000
[[ $leader == "$taker" ]] || fail "after the handover: $(summary_line); want node-$taker alone leading" "node-${rest[0]}" "node-${rest[1]}"
describe
((handover_ms < ttl_ms)) || fail "the handover took $handover_ms ms, not less than the ttl ($ttl_ms ms)" "node-$old" "node-$taker"
ok "handover in $handover_ms ms (< ttl ${ttl_ms} ms): the old leader deleted its key on the way out"
if [[ $write_mode == forward ]]; then
	((writes_ok == writes_sent && writes_sent > 0)) ||
		fail "$((writes_sent - writes_ok)) of $writes_sent writes failed during the handover (${writes_failed}); a follower should hold them for the new leader" "node-$old" "node-${rest[0]}" "node-${rest[1]}"
	ok "none of the $writes_sent writes failed: followers held them until node-$taker led"
fi

pause "crash the new leader, node-$leader (SIGKILL)"
step "Crash of the leader (SIGKILL)"
crashed=$leader
mapfile -t rest < <(others "$crashed")
note "kill -KILL ${pid[crashed]}   # node-$crashed: no goodbye; its key lives until its lease expires (ttl ${ttl_s}s)"
start_writes "$tmp/writes-crash" "${http_port[rest[0]]}"
sleep 0.3
now_ms
t0=$now
signal_node KILL "$crashed"
time_takeover "$t0" $((ttl_ms + 3000)) 0.01 "${rest[@]}"
sleep 0.3
stop_writes "$tmp/writes-crash"
[[ -n $taker ]] || fail "no other instance led within $((ttl_ms + 3000)) ms of SIGKILL to node-$crashed" "node-$crashed" "node-${rest[0]}" etcd
failover_ms=$took_ms
note "node-$taker leads $(fmt_ms "$failover_ms") after the crash."
note "Writes sent to node-${rest[0]} meanwhile: $writes_sent, answered 200: $writes_ok (accepted by ${writes_by:-nobody})."
if ((writes_ok < writes_sent)); then
	note "The others got 503 with Retry-After, after waiting up to the gate's hold (2s): until"
	note "the crashed leader's lease expires, nobody may take over."
fi
reap_node "$crashed"
wait_leader 5000
[[ $leader == "$taker" ]] || fail "after the failover: $(summary_line); want node-$taker alone leading" "node-$taker"
describe
ok "failover in $failover_ms ms (<= ttl + 3 s = $((ttl_ms + 3000)) ms)"
if [[ $write_mode != reject ]]; then
	http POST "${http_port[rest[0]]}" /write
	note "$(printf 'POST /write   node-%d -> %s  %s' "${rest[0]}" "$res_status" "$res_body")"
	if [[ $res_status == 200 && $res_body == *"by node-$taker "* ]] || [[ $res_status == 307 || $res_status == 308 ]]; then
		ok "writes are served again, by node-$taker"
	else
		fail "after the failover, POST /write on node-${rest[0]} answered $res_status '$res_body'" "node-${rest[0]}"
	fi
fi

pause "restart node-$old and node-$crashed"
step "Restart the stopped instances"
for i in "$old" "$crashed"; do
	start_node "$i"
	note "node-$i started again (pid ${pid[i]})"
done
wait_leader 15000
[[ $leader == "$taker" ]] || fail "after the restart: $(summary_line); want node-$taker still leading and both others following it" "node-$old" "node-$crashed" "node-$taker"
describe
ok "node-$old and node-$crashed rejoined as followers of node-$taker"

say ""
say "${bold}Summary${reset}: handover after SIGTERM $(fmt_ms "$handover_ms"); failover after SIGKILL $(fmt_ms "$failover_ms") (ttl ${ttl_s}s)."
printf 'demo: %d passed, 0 failed\n' "$passed"

if [[ $mode == keep ]]; then
	explore
fi
