#!/usr/bin/env bash
# Every test, on a fresh machine as in CI: installs what the tests need and is missing
# (Prometheus with promtool, Chromium, HAProxy, PostgreSQL, PgBouncer and Redis through
# apt-get, and a kube-apiserver built from the Go module proxy), then runs
#   go test -race -count=1 -timeout 45m ./...
# in this module and in every nested one (each directory with a go.mod, but tools/), and ends
# with a line that says which tests were skipped and why, or that none was, and lists the
# tests that failed with the first thing each said. The end-to-end
# package ./e2e runs beside the rest, which goes one package at a time (see lanes below).
#   ./test.sh             install what is missing, then test
#   ./test.sh --install   only install what is missing
#   ./test.sh --short     the quick tier: go test -short -count=1 ./... in every module, no
#                         installs and no race detector (about 2 minutes on 2 cores): the
#                         elector, the conformance suite on the in-memory store, every config
#                         golden and the unit tests; whatever starts a store, a Caddy process
#                         or a build is skipped
# TEST_PACKAGES narrows the packages (default ./...; then every module runs in turn);
# TEST_NO_INSTALL=1 skips the installs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

step() {
	printf '\n==> %s\n' "$*"
}

sudo=()
[[ $EUID -eq 0 ]] || sudo=(sudo)
updated=
apt_install() {
	if [[ -z $updated ]]; then
		"${sudo[@]}" apt-get update -q
		updated=1
	fi
	"${sudo[@]}" apt-get install -y -q --no-install-recommends "$@"
}

# first_line prints the first line a command writes. Not "| head -n 1": head exits after one
# line, and under pipefail the SIGPIPE of a command that writes more (haproxy -v does) fails
# the script at random.
first_line() {
	local out
	out=$("$@" 2>&1)
	printf '%s\n' "${out%%$'\n'*}"
}

install_missing() {
	step "prometheus and promtool (deploy/prometheus tests; e2e/browser runs the dashboard's queries on a real server)"
	if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
		apt_install prometheus # Debian's prometheus package carries promtool.
		# Debian starts its own service on install; the tests start theirs.
		"${sudo[@]}" service prometheus stop >/dev/null 2>&1 || true
	fi
	first_line promtool --version
	first_line prometheus --version

	step "chromium (e2e/browser drives it headless through the status page)"
	if ! command -v chromium >/dev/null; then
		apt_install chromium
	fi
	# Debian's chromium wrapper script complains on stderr about this machine's memory size.
	chromium --version 2>/dev/null

	step "haproxy (e2e TestHAProxy runs deploy/haproxy with it)"
	if ! [[ -x /usr/sbin/haproxy ]] && ! command -v haproxy >/dev/null; then
		apt_install haproxy # the version the recipe in docs/haproxy.md is tested with
	fi
	first_line "$(command -v haproxy || echo /usr/sbin/haproxy)" -v

	step "PostgreSQL and PgBouncer (internal/testkit/pgtest starts its own servers)"
	have_postgres() { compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null; }
	have_pgbouncer() { command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]]; }
	if ! have_postgres || ! have_pgbouncer; then
		# The tests run initdb themselves: the package's default cluster would only take memory.
		"${sudo[@]}" mkdir -p /etc/postgresql-common/createcluster.d
		echo 'create_main_cluster = false' | "${sudo[@]}" tee /etc/postgresql-common/createcluster.d/no-main.conf >/dev/null
		apt_install postgresql postgresql-contrib pgbouncer
		# Debian starts pgbouncer's own service on install; the tests start theirs.
		"${sudo[@]}" service pgbouncer stop >/dev/null 2>&1 || true
	fi
	have_postgres && have_pgbouncer && echo "PostgreSQL and PgBouncer installed"

	step "redis-server (l4/e2e starts its own servers, never the system service)"
	if ! command -v redis-server >/dev/null; then
		apt_install redis-server
		# Debian starts its own service on install; the tests start theirs.
		"${sudo[@]}" service redis-server stop >/dev/null 2>&1 || true
	fi
	redis-server --version

	if [[ -d kubernetes ]]; then
		step "kube-apiserver v1.37.2 for the kubernetes store's tests (built from the Go module proxy once, then cached)"
		(cd kubernetes && go run ./internal/kubetest/buildapiserver)
	fi
}

mode=${1:-}
if [[ $# -gt 1 || ! $mode =~ ^(|--install|--short)$ ]]; then
	echo "usage: ./test.sh [--install | --short]" >&2
	exit 2
fi
[[ $mode == --short || -n ${TEST_NO_INSTALL:-} ]] || install_missing
[[ $mode == --install ]] && exit 0

report=$(mktemp -d)
trap 'rm -rf "$report"' EXIT
go build -o "$report/testreport" ./internal/testkit/testreport

status=0
modules=()
while read -r mod; do
	modules+=("$(dirname "$mod")")
done < <(find . -name go.mod -not -path './tools/*' -not -path '*/testdata/*' | sort)
flags=(-race -count=1 -timeout 45m)
[[ $mode != --short ]] || flags=(-short -count=1 -timeout 10m)

# The runs of go test: each in a module's directory (job_dirs) on some of its packages
# (job_pkgs), with flags of its own besides flags (job_flags), called job_names in reports.
job_dirs=() job_pkgs=() job_flags=() job_names=()
add_job() { # DIR PACKAGES [FLAGS [NAME]]
	job_dirs+=("$1")
	job_pkgs+=("$2")
	job_flags+=("${3:-}")
	job_names+=("${4:-$2 in $1}")
}

# lanes: the full run goes in two lanes. The end-to-end package (./e2e: real Caddy fleets
# whose scenarios mostly wait out ttls, some two at a time) takes one lane; the other runs the
# root module's other packages one at a time (-p 1: with ./e2e beside them, two test
# processes, as go test's own -p 2 on two cores ran the root module before), then each
# nested module as go test runs it, rather than after ./e2e: the full run takes about as
# long as the longer lane (each about 22 minutes on 2 cores).
lanes=
if [[ $mode != --short && -z ${TEST_PACKAGES:-} && -d e2e ]]; then
	lanes=1
	e2e_pkg="$(go list -m)/e2e"
	add_job . ./e2e/
	# Each of these packages takes under 10 minutes: one that hangs ends at 20, not 45.
	add_job . "$(go list ./... | grep -vxF "$e2e_pkg" | tr '\n' ' ')" "-p 1 -timeout 20m" "./... but ./e2e in ."
	for dir in "${modules[@]}"; do
		[[ $dir == . ]] || add_job "$dir" ./...
	done
else
	for dir in "${modules[@]}"; do
		add_job "$dir" "${TEST_PACKAGES:-./...}"
	done
fi

# test_job I: go test of job I, its report printed and kept in $report/I.log, its exit
# status in $report/I.log.status. The JSON keeps every skip and its reason; testreport
# prints what a plain go test prints as it comes, and the skips at the end.
test_job() {
	local i=$1 log=$report/$1.log
	set +e
	# shellcheck disable=SC2086 # job_flags and job_pkgs are lists of words
	(cd "${job_dirs[$i]}" && go test "${flags[@]}" ${job_flags[$i]} -json ${job_pkgs[$i]}) | "$report/testreport" | tee "$log"
	echo "${PIPESTATUS[0]}" >"$log.status"
	set -e
}

# describe_job I: the step title of job I.
describe_job() {
	echo "go test ${flags[*]} ${job_flags[$1]:+${job_flags[$1]} }${job_names[$1]}"
}

if [[ $mode == --short ]]; then
	# The quick tier runs the modules side by side: much of it is the elector's tests
	# waiting out real time, which leaves the cores to the other modules' builds.
	for i in "${!job_dirs[@]}"; do
		test_job "$i" >/dev/null &
	done
	wait
elif [[ -n $lanes ]]; then
	step "$(describe_job 0): beside the rest, its report comes last"
	test_job 0 >/dev/null &
	e2e_lane=$!
fi
for i in "${!job_dirs[@]}"; do
	[[ -z $lanes || $i -ne 0 ]] || continue
	step "$(describe_job "$i")"
	if [[ $mode == --short ]]; then
		cat "$report/$i.log"
	else
		test_job "$i"
	fi
done
if [[ -n $lanes ]]; then
	wait "$e2e_lane" || true
	step "$(describe_job 0)"
	cat "$report/0.log"
fi
for i in "${!job_dirs[@]}"; do
	[[ $(<"$report/$i.log.status") -eq 0 ]] || status=1
	sed -n '/^testreport: /,$p' "$report/$i.log" | sed "s|^testreport: |${job_names[$i]}: |" >>"$report/skips"
done
if [[ ${#job_dirs[@]} -gt 1 ]]; then
	step "skipped and failed, run by run"
	cat "$report/skips"
fi
if [[ $status -ne 0 ]]; then
	echo "FAIL: some tests failed (see above)"
fi
exit "$status"
