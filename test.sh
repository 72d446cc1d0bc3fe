#!/usr/bin/env bash
# Every test, on a fresh machine as in CI: installs what the tests need and is missing
# (Prometheus with promtool, Chromium, HAProxy, PostgreSQL, PgBouncer and Redis through
# apt-get, and a kube-apiserver built from the Go module proxy), then runs
#   go test -race -count=1 -timeout 45m ./...
# in this module and in every nested one (each directory with a go.mod, but tools/), and ends
# with a line that says which tests were skipped and why, or that none was.
#   ./test.sh             install what is missing, then test
#   ./test.sh --install   only install what is missing
#   ./test.sh --short     the quick tier: go test -short -count=1 ./... in every module, no
#                         installs and no race detector (a few minutes on 2 cores): the
#                         elector, the conformance suite on the in-memory store, every config
#                         golden and the unit tests; whatever starts a store, a Caddy process
#                         or a build is skipped
# TEST_PACKAGES narrows the packages (default ./...); TEST_NO_INSTALL=1 skips the installs.
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

# test_module DIR LOG: go test in the module at DIR, its report printed and kept in LOG,
# its exit status in LOG.status. The JSON keeps every skip and its reason; testreport prints
# what a plain go test prints as it comes, and the skips at the end.
test_module() {
	local dir=$1 log=$2
	set +e
	(cd "$dir" && go test "${flags[@]}" -json ${TEST_PACKAGES:-./...}) | "$report/testreport" | tee "$log"
	echo "${PIPESTATUS[0]}" >"$log.status"
	set -e
}

if [[ $mode == --short ]]; then
	# The quick tier runs the modules side by side: much of it is the elector's tests
	# waiting out real time, which leaves the cores to the other modules' builds.
	for i in "${!modules[@]}"; do
		test_module "${modules[$i]}" "$report/$i.log" >/dev/null &
	done
	wait
fi
for i in "${!modules[@]}"; do
	dir=${modules[$i]}
	step "go test ${flags[*]} ${TEST_PACKAGES:-./...} (in ${dir})"
	if [[ $mode == --short ]]; then
		cat "$report/$i.log"
	else
		test_module "$dir" "$report/$i.log"
	fi
	[[ $(<"$report/$i.log.status") -eq 0 ]] || status=1
	sed -n '/^testreport: /,$p' "$report/$i.log" | sed "s|^testreport: |in $dir: |" >>"$report/skips"
done
if [[ ${#modules[@]} -gt 1 ]]; then
	step "skipped, module by module"
	cat "$report/skips"
fi
if [[ $status -ne 0 ]]; then
	echo "FAIL: some tests failed (see above)"
fi
exit "$status"
