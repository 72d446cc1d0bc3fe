#!/usr/bin/env bash
# Build or run Caddy with caddy-leader from this checkout, the way a user would with xcaddy.
# The binary is always ./caddy in the repository root.
set -euo pipefail

# Every path below is relative to the repository root, wherever the caller stands.
cd "$(dirname "${BASH_SOURCE[0]}")"

readonly plugin_module=github.com/caddyleader/caddy-leader
caddy_version=${CADDY_VERSION:-v2.11.9}

# The modules this plugin registers; a binary that lacks one of them was built without it.
readonly plugin_modules=(leader http.handlers.leader_gate http.matchers.leader)

usage() {
	cat <<EOF
Usage: ./xcaddy.sh COMMAND [ARGS...]

Commands:
  build [XCADDY_ARGS...]  Build ./caddy with this plugin from the checkout, pinned to
                          Caddy $caddy_version (set CADDY_VERSION to change it), then
                          check that 'caddy list-modules' shows the plugin's modules.
                          XCADDY_ARGS are passed on to 'xcaddy build' (e.g. --with MODULE).
  run [CADDY_ARGS...]     Build ./caddy if it is missing or older than the Go sources,
                          then run './caddy run CADDY_ARGS...' (default:
                          --config quickstart.Caddyfile). If ETCD_ENDPOINTS is unset and
                          nothing answers on 127.0.0.1:2379, it first starts a local
                          single-member etcd (cmd/etcd-local) and stops it on exit.
  demo [--keep|--manual|--ci]
                          Build ./caddy and ./etcd-local if needed, start a local etcd
                          and three Caddy instances on 127.0.0.1 (demo/Caddyfile), and
                          walk through a handover and a crash, timed. --keep: explore by
                          hand afterwards; --manual: skip the walkthrough; --ci: no
                          prompts or colors, check every step, exit non-zero on failure.
                          DEMO_PORT_BASE sets the first port (default: 18080).
  help                    Show this message.

Uses xcaddy from PATH if there is one, else 'go tool xcaddy' (the version pinned in go.mod).
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

	local xcaddy=(go tool xcaddy)
	if command -v xcaddy >/dev/null 2>&1; then
		xcaddy=(xcaddy)
	fi

	# Ctrl-C stops xcaddy too; that is no build failure to report.
	local interrupted=false
	trap 'interrupted=true' INT
	# The @v0.0.0 is needed: without a version, xcaddy's `go get` asks the module proxy for
	# the plugin's latest version despite the replacement, and the proxy may not serve it.
	run_cmd "${xcaddy[@]}" build "$caddy_version" \
		--output caddy \
		--with "$plugin_module@v0.0.0=./" \
		"$@" || {
		$interrupted && exit 130
		die "building ./caddy failed; the output above says why"
	}
	trap - INT

	check_modules
}

check_modules() {
	[[ -x ./caddy ]] || die "the build finished but ./caddy is missing or not executable"

	local listed
	listed=$(./caddy list-modules) || die "./caddy list-modules failed"

	local missing=() module
	for module in "${plugin_modules[@]}"; do
		grep -Fqx -- "$module" <<<"$listed" || missing+=("$module")
	done
	if ((${#missing[@]} > 0)); then
		die "./caddy was built but does not list these caddy-leader modules: ${missing[*]}"
	fi
	printf 'ok: ./caddy lists %s\n' "${plugin_modules[*]}"
}

# True when the binary (default ./caddy) is missing or any Go source (tests aside) or module
# file is newer than it.
needs_build() {
	local binary=${1:-./caddy}
	[[ -x $binary ]] || return 0
	local newer
	newer=$(find . -path ./.git -prune -o \
		\( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) -newer "$binary" -print -quit)
	[[ -n $newer ]]
}

build_etcd_local() {
	command -v go >/dev/null 2>&1 || die "Go is not installed or not on PATH; it is needed to build ./etcd-local (https://go.dev/doc/install)"
	run_cmd go build -o ./etcd-local ./cmd/etcd-local || die "building ./etcd-local failed; the output above says why"
}

readonly local_etcd=127.0.0.1:2379

# True when something accepts TCP connections on host:port.
listening() {
	local host=${1%:*} port=${1##*:}
	(exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# Starts cmd/etcd-local in the background unless an etcd is configured or already there.
# Sets etcd_pid when it started one.
etcd_pid=
ensure_etcd() {
	[[ -z ${ETCD_ENDPOINTS:-} ]] || return 0
	if listening "$local_etcd"; then
		printf 'using the etcd already listening on %s\n' "$local_etcd"
		return 0
	fi
	build_etcd_local
	./etcd-local -listen "$local_etcd" &
	etcd_pid=$!
	local i
	for ((i = 0; i < 100; i++)); do
		listening "$local_etcd" && return 0
		kill -0 "$etcd_pid" 2>/dev/null || die "the local etcd exited; is port 2379 or 2380 in use?"
		sleep 0.1
	done
	die "the local etcd did not start listening on $local_etcd within 10s"
}

stop_etcd() {
	if [[ -n $etcd_pid ]]; then
		kill "$etcd_pid" 2>/dev/null || true
		wait "$etcd_pid" 2>/dev/null || true
	fi
}

run() {
	if needs_build; then
		build
	fi
	(($# > 0)) || set -- --config quickstart.Caddyfile
	ensure_etcd
	if [[ -z $etcd_pid ]]; then
		exec ./caddy run "$@"
	fi
	trap stop_etcd EXIT
	trap 'exit 130' INT TERM
	./caddy run "$@"
}

# Builds what the demo runs, only if it is missing or out of date, then hands over to
# demo/demo.sh, which starts, walks through and stops everything.
demo() {
	local arg
	for arg in "$@"; do
		case $arg in
		--ci | --keep | --manual) ;;
		help | -h | --help) exec bash demo/demo.sh --help ;;
		*) die "demo: unknown option '$arg' (see ./xcaddy.sh demo --help)" ;;
		esac
	done
	if needs_build ./caddy; then
		build
	fi
	if needs_build ./etcd-local; then
		build_etcd_local
	fi
	exec bash demo/demo.sh "$@"
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
		build "$@"
		;;
	run)
		run "$@"
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
