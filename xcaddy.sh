#!/usr/bin/env bash
# Build or run Caddy with caddy-leader from this checkout, the way a user would with xcaddy.
# The binary is ./caddy in the repository root (XCADDY_OUTPUT names another path).
set -euo pipefail

# Every path below is relative to the repository root, wherever the caller stands.
cd "$(dirname "${BASH_SOURCE[0]}")"

readonly plugin_module=github.com/caddyleader/caddy-leader
readonly l4_module=github.com/caddyleader/caddy-leader/l4
# caddy-l4 itself, at the version l4/go.mod requires: the l4 module brings only caddy-l4's
# core, and the recipes of docs/layer4.md need its handlers (proxy) too.
readonly caddy_l4_module=github.com/mholt/caddy-l4@v0.1.2
caddy_version=${CADDY_VERSION:-v2.11.9}
# The binary that build writes; XCADDY_OUTPUT changes it for the build command only. An
# absolute path: xcaddy may run in tools/ (go tool -C), where ./caddy would land.
output=$PWD/caddy

# The modules this plugin registers; a binary that lacks one of them was built without it.
readonly plugin_modules=(
	admin.api.leader
	admin.api.leader_status
	events.handlers.leader_webhook
	http.handlers.leader_gate
	http.handlers.leader_health
	http.handlers.leader_status
	http.matchers.leader
	http.matchers.leader_candidate
	http.reverse_proxy.upstreams.leader
	leader
	leader.stores.etcd
	leader.stores.postgres
)
# Checked too when ./caddy is built with --l4: the layer-4 modules of this plugin, and the
# caddy-l4 modules that the recipes of docs/layer4.md use (the layer4 app, its proxy handler).
readonly l4_modules=(
	layer4.matchers.leader
	layer4.handlers.leader_gate
	layer4
	layer4.handlers.proxy
)

usage() {
	cat <<EOF
Usage: ./xcaddy.sh COMMAND [ARGS...]

Commands:
  build [--l4] [XCADDY_ARGS...]
                          Build ./caddy with this plugin from the checkout, pinned to
                          Caddy $caddy_version (set CADDY_VERSION to change it), then
                          check that 'caddy list-modules' shows the plugin's modules.
                          --l4 adds the layer-4 modules (the l4/ module) and all of
                          caddy-l4 (its layer4 app and handlers, which the recipes use).
                          XCADDY_ARGS are passed on to 'xcaddy build' (e.g. --with MODULE).
                          A first build downloads Caddy's dependencies and compiles
                          about 1,000 packages: about 4 minutes on 2 cores; later
                          builds reuse Go's caches and take about a minute. It prints
                          each module it downloads and each package it compiles.
  run [CADDY_ARGS...]     Build ./caddy if it is missing or older than the Go sources,
                          then run './caddy run CADDY_ARGS...' (default:
                          --config quickstart.Caddyfile). If ETCD_ENDPOINTS is unset, it
                          uses the local etcd, starting it first if nothing answers on
                          $default_etcd_listen (see 'etcd start'); that etcd keeps running
                          when the instance exits, so that other instances keep their
                          store. It refuses to start when the config's admin address is
                          already in use (by another instance, most likely).
  etcd start|stop|status  Start the local single-member etcd (cmd/etcd-local, built into
                          ./etcd-local when missing or stale) in the background, stop it,
                          or tell whether it runs (exit status 3 when it does not). Its
                          pid file and log are in .etcd-local/. Its data is DELETED when it
                          stops unless XCADDY_ETCD_DATA names a directory to keep it in.
  demo [--keep|--manual|--ci] [--keep-logs] [--store etcd|postgres]
                          Build ./caddy and ./etcd-local if needed, start a local etcd
                          and three Caddy instances on 127.0.0.1 (demo/Caddyfile), and
                          walk through a handover and a crash, timed. --keep: explore by
                          hand afterwards; --manual: skip the walkthrough; --ci: no
                          prompts or colors, check every step, exit non-zero on failure.
                          --store postgres: elect through a local PostgreSQL server
                          instead (needs PostgreSQL installed: apt-get install postgresql).
                          --keep-logs: keep the logs on exit (they are deleted otherwise,
                          unless a step fails). DEMO_PORT_BASE sets the first port
                          (default: 18080).
  help                    Show this message.

Uses xcaddy from PATH if there is one, else 'go tool -C tools xcaddy' (the version pinned in tools/go.mod).

Environment for 'run' and 'etcd' (the defaults suit a one-machine try-out):
  CADDY_BIN           a Caddy binary to run instead of building ./caddy
  XCADDY_ETCD_LISTEN  the local etcd's client address (default: $default_etcd_listen)
  XCADDY_ETCD_PEER    the local etcd's peer address (default: $default_etcd_peer)
  XCADDY_ETCD_STATE   where its pid file and log go (default: .etcd-local)
  XCADDY_ETCD_DATA    a directory that keeps its data across restarts (default: none, a
                      temporary directory deleted when it stops)
  XCADDY_ETCD_BIN     where its binary is built (default: ./etcd-local)

Environment for 'build':
  XCADDY_OUTPUT       the absolute path to write the binary to (default: ./caddy)
  XCADDY_GO_BUILD_FLAGS  xcaddy's own: the go build flags (default: -v and xcaddy's defaults)
EOF
}

die() {
	printf 'xcaddy.sh: %s\n' "$*" >&2
	exit 1
}

# Prints a command, quoted so it can be pasted back into a shell, then runs it.
run_cmd() {
	printf '+'
	printf ' %q' "$@"
	printf '\n'
	"$@"
}

build() {
	command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; xcaddy needs it to compile Caddy (https://go.dev/doc/install)"

	# xcaddy from PATH, else the version pinned in tools/go.mod: a module of its own, so that
	# xcaddy takes no part in the version selection of the plugin's users.
	local xcaddy=(go tool -C "$PWD/tools" xcaddy)
	if command -v xcaddy >/dev/null 2>&1; then
		xcaddy=(xcaddy)
	fi

	local with_l4=()
	if [[ ${1:-} == --l4 ]]; then
		shift
		with_l4=(--with "$l4_module@v0.0.0=$PWD/l4" --with "$caddy_l4_module")
	fi

	# -v makes go print each package it compiles: a first build is long, and silent
	# otherwise. The rest are xcaddy's defaults, which a flag of ours would replace.
	export XCADDY_GO_BUILD_FLAGS=${XCADDY_GO_BUILD_FLAGS:-"-v -ldflags '-w -s' -trimpath -tags nobadger,nomysql,nopgx"}
	printf "Building %s: a first build downloads Caddy's dependencies and compiles about 1,000\n" "$output"
	printf "packages: about 4 minutes on 2 cores; later builds reuse Go's caches (about a minute).\n"
	printf "Go names each module it downloads and each package it compiles as it goes.\n"

	# Ctrl-C stops xcaddy too; that is no build failure to report.
	local interrupted=false
	trap 'interrupted=true' INT
	# The @v0.0.0 is needed: without a version, xcaddy's `go get` asks the module proxy for
	# the plugin's latest version despite the replacement, and the proxy may not serve it.
	run_cmd "${xcaddy[@]}" build "$caddy_version" \
		--output "$output" \
		--with "$plugin_module@v0.0.0=$PWD" \
		"${with_l4[@]}" \
		"$@" || {
		$interrupted && exit 130
		die "building $output failed; the output above says why"
	}
	trap - INT

	check_modules "${plugin_modules[@]}" ${with_l4[@]:+"${l4_modules[@]}"}
}

# check_modules MODULE...: the built binary lists every MODULE.
check_modules() {
	[[ -x $output ]] || die "the build finished but $output is missing or not executable"

	local listed
	listed=$("$output" list-modules) || die "$output list-modules failed"

	local missing=() module
	for module in "$@"; do
		grep -Fqx -- "$module" <<<"$listed" || missing+=("$module")
	done
	if ((${#missing[@]} > 0)); then
		die "$output was built but does not list these modules: ${missing[*]}"
	fi
	printf 'ok: %s lists %s\n' "$output" "$*"
}

# needs_build BINARY [PATH...]: true when BINARY is missing, or when a Go source (tests
# aside), go.mod or go.sum under the PATHs (default: the whole checkout) is newer than it.
needs_build() {
	local binary=$1
	shift
	(($# > 0)) || set -- .
	[[ -x $binary ]] || return 0
	local newer
	newer=$(find "$@" -path ./.git -prune -o \
		\( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) -newer "$binary" -print -quit)
	[[ -n $newer ]]
}

readonly default_etcd_listen=127.0.0.1:2379 default_etcd_peer=127.0.0.1:2380
readonly etcd_listen=${XCADDY_ETCD_LISTEN:-$default_etcd_listen}
readonly etcd_peer=${XCADDY_ETCD_PEER:-$default_etcd_peer}
readonly etcd_state=${XCADDY_ETCD_STATE:-.etcd-local}
readonly etcd_bin=${XCADDY_ETCD_BIN:-./etcd-local}
readonly etcd_data=${XCADDY_ETCD_DATA:-}
readonly etcd_pidfile=$etcd_state/pid etcd_log=$etcd_state/log

# build_etcd_local BINARY: builds the local etcd unless BINARY is up to date; it depends on
# its own package and on the module's requirements only.
build_etcd_local() {
	local binary=$1
	needs_build "$binary" ./cmd/etcd-local ./go.mod ./go.sum || return 0
	command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; it is needed to build $binary (https://go.dev/doc/install)"
	run_cmd go build -o "$binary" ./cmd/etcd-local || die "building $binary failed; the output above says why"
}

# True when something accepts TCP connections on host:port.
listening() {
	local host=${1%:*} port=${1##*:}
	(exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# Prints the pid of the local etcd this script started, if it still runs.
etcd_running_pid() {
	local pid
	[[ -f $etcd_pidfile ]] || return 1
	pid=$(<"$etcd_pidfile")
	[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
	# After a reboot or a crash the pid may belong to another process by now.
	[[ $(ps -p "$pid" -o args= 2>/dev/null) == *etcd-local* ]] || return 1
	printf '%s\n' "$pid"
}

etcd_stop_hint() {
	local hint="./xcaddy.sh etcd stop"
	[[ -z ${XCADDY_ETCD_STATE:-} ]] || hint="XCADDY_ETCD_STATE=$etcd_state $hint"
	printf '%s' "$hint"
}

# Starts the local etcd in the background, in its own process group (so that Ctrl-C on an
# instance does not reach it) and detached from the terminal, unless it already runs.
etcd_start() {
	local pid
	if pid=$(etcd_running_pid); then
		printf 'the local etcd already runs on %s (pid %s; %s stops it)\n' "$etcd_listen" "$pid" "$(etcd_stop_hint)"
		return 0
	fi
	listening "$etcd_listen" && die "something that this script did not start listens on $etcd_listen; stop it, or set XCADDY_ETCD_LISTEN and XCADDY_ETCD_PEER to other ports"
	build_etcd_local "$etcd_bin"
	mkdir -p "$etcd_state"
	set -m
	local data_args=() data_note="its data is DELETED when it stops (set XCADDY_ETCD_DATA=<dir> to keep it)"
	if [[ -n $etcd_data ]]; then
		data_args=(-data-dir "$etcd_data")
		data_note="its data is kept in $etcd_data"
	fi
	nohup "$etcd_bin" -listen "$etcd_listen" -peer "$etcd_peer" "${data_args[@]}" >"$etcd_log" 2>&1 </dev/null &
	pid=$!
	set +m
	printf '%s\n' "$pid" >"$etcd_pidfile"
	local i
	for ((i = 0; i < 100; i++)); do
		if listening "$etcd_listen"; then
			printf 'started the local etcd on %s (pid %s, log in %s); it keeps running after Caddy exits: %s stops it; %s\n' \
				"$etcd_listen" "$pid" "$etcd_log" "$(etcd_stop_hint)" "$data_note"
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			rm -f "$etcd_pidfile"
			die "the local etcd exited; is $etcd_listen or $etcd_peer in use? Its log ($etcd_log) ends: $(tail -n 3 "$etcd_log" 2>/dev/null)"
		fi
		sleep 0.1
	done
	die "the local etcd did not start listening on $etcd_listen within 10s; see $etcd_log"
}

etcd_stop() {
	local pid i
	if ! pid=$(etcd_running_pid); then
		rm -f "$etcd_pidfile"
		printf 'the local etcd is not running\n'
		return 0
	fi
	kill "$pid"
	for ((i = 0; i < 100; i++)); do
		if ! kill -0 "$pid" 2>/dev/null; then
			rm -f "$etcd_pidfile"
			printf 'stopped the local etcd (pid %s)\n' "$pid"
			return 0
		fi
		sleep 0.1
	done
	die "the local etcd (pid $pid) did not exit within 10s of SIGTERM"
}

etcd_status() {
	local pid
	if pid=$(etcd_running_pid); then
		printf 'the local etcd runs on %s (pid %s, log in %s)\n' "$etcd_listen" "$pid" "$etcd_log"
		return 0
	fi
	printf 'the local etcd is not running\n'
	return 3
}

etcd_command() {
	(($# == 1)) || die "usage: ./xcaddy.sh etcd start|stop|status"
	case $1 in
	start) etcd_start ;;
	stop) etcd_stop ;;
	status) etcd_status ;;
	*) die "etcd: unknown command '$1' (start, stop or status)" ;;
	esac
}

# Uses the local etcd unless ETCD_ENDPOINTS names one, starting it if it is not there.
ensure_etcd() {
	[[ -z ${ETCD_ENDPOINTS:-} ]] || return 0
	if ! etcd_running_pid >/dev/null && listening "$etcd_listen"; then
		printf 'using the etcd already listening on %s\n' "$etcd_listen"
	else
		etcd_start
	fi
	export ETCD_ENDPOINTS=$etcd_listen
}

# Prints the TCP address (host:port) of the admin endpoint that caddy run CADDY_ARGS would
# open, or nothing when it opens none there (disabled, a unix socket) or the config does not
# load (caddy run then says why).
admin_address() {
	local caddy=$1 config= adapter=
	shift
	while (($# > 0)); do
		case $1 in
		--config | -c) config=${2:-} && shift ;;
		--config=*) config=${1#*=} ;;
		--adapter | -a) adapter=${2:-} && shift ;;
		--adapter=*) adapter=${1#*=} ;;
		esac
		shift
	done
	if [[ -z $config && -f Caddyfile ]]; then
		config=Caddyfile
	fi
	local addr=${CADDY_ADMIN:-localhost:2019}
	if [[ -n $config ]]; then
		local json head
		if [[ $config == *.json && -z $adapter ]]; then
			json=$(<"$config") || return 0
		else
			json=$("$caddy" adapt --config "$config" ${adapter:+--adapter "$adapter"} 2>/dev/null) || return 0
		fi
		json=${json//[[:space:]]/}
		# The admin object's plain fields come before its nested objects.
		if [[ $json =~ \"admin\":\{([^{}]*) ]]; then
			head=${BASH_REMATCH[1]}
			[[ $head != *'"disabled":true'* ]] || return 0
			if [[ $head =~ \"listen\":\"([^\"]*)\" ]]; then
				addr=${BASH_REMATCH[1]}
			fi
		fi
	fi
	addr=${addr#tcp/}
	[[ $addr != unix* ]] || return 0
	local host=${addr%:*} port=${addr##*:}
	host=${host#[}
	host=${host%]}
	[[ -n $host && $host != localhost ]] || host=127.0.0.1
	printf '%s:%s\n' "$host" "$port"
}

# Two instances on one admin address both listen (Caddy's listeners share ports), and admin
# calls (resign, transfer) then reach either of them.
refuse_admin_in_use() {
	local addr
	addr=$(admin_address "$@")
	if [[ -n $addr ]] && listening "$addr"; then
		die "the admin address $addr is already in use, most likely by another Caddy instance; admin calls (resign, transfer) would reach either one. Give this instance its own, e.g. ADMIN_PORT=2020 for quickstart.Caddyfile, or the admin global option in your Caddyfile"
	fi
}

run() {
	local caddy=${CADDY_BIN:-./caddy}
	if [[ -z ${CADDY_BIN:-} ]] && needs_build ./caddy; then
		build
	fi
	(($# > 0)) || set -- --config quickstart.Caddyfile
	refuse_admin_in_use "$caddy" "$@"
	ensure_etcd
	exec "$caddy" run "$@"
}

# Builds what the demo runs, only if it is missing or out of date, then hands over to
# cmd/demo, which starts, walks through and stops everything.
demo() {
	local arg store=etcd want_store=0
	for arg in "$@"; do
		if ((want_store)); then
			store=$arg want_store=0
			continue
		fi
		case $arg in
		--ci | --keep | --manual) ;;
		--store) want_store=1 ;;
		--store=*) store=${arg#--store=} ;;
		help | -h | --help) exec go run ./cmd/demo --help ;;
		*) die "demo: unknown option '$arg' (see ./xcaddy.sh demo --help)" ;;
		esac
	done
	((want_store == 0)) || die "demo: --store needs a value: etcd or postgres"
	case $store in
	etcd | postgres) ;;
	*) die "demo: --store '$store': use etcd or postgres" ;;
	esac
	if needs_build ./caddy; then
		build
	fi
	if [[ $store == etcd ]]; then
		build_etcd_local ./etcd-local
	fi
	exec go run ./cmd/demo "$@"
}

main() {
	if (($# == 0)); then
		usage >&2
		exit 2
	fi

	local command=$1
	shift
	case $command in
	build)
		output=${XCADDY_OUTPUT:-$output}
		build "$@"
		;;
	run)
		run "$@"
		;;
	etcd)
		etcd_command "$@"
		;;
	demo)
		demo "$@"
		;;
	help | -h | --help)
		usage
		;;
	*)
		printf 'xcaddy.sh: unknown command %q\n\n' "$command" >&2
		usage >&2
		exit 2
		;;
	esac
}

main "$@"
