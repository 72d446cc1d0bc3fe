// Command testreport reads `go test -json` on stdin and prints what a plain `go test` prints
// (each package's closing line, and the output of every test that failed), then one line
// that lists the tests that were skipped and why, so that a run that passed by skipping
// says so, and, when some failed, the failed tests with their first complaint: a CI log
// read from its end shows what failed without the goroutine dump of a timeout above it.
// It exits 0; the caller takes go test's own exit status.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output events name the package here
	Test       string
	Output     string
}

// outcome is one skipped or failed test (test is empty for a package that failed as a
// whole) and the reason it gave.
type outcome struct {
	pkg, test, reason string
}

// results are the tests that did not pass, each in the order they ended.
type results struct {
	skips, failures []outcome
}

func main() {
	r := report(os.Stdin, os.Stdout)
	fmt.Println(summary(r))
}

// report copies the plain go test output from the JSON on in to out and returns the
// skipped and the failed tests.
func report(in io.Reader, out io.Writer) results {
	var r results
	buffered := map[string][]string{} // package + test -> its output so far
	panics := map[string]string{}     // package -> the first panic line it printed
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			fmt.Fprintln(out, sc.Text()) // not JSON: go itself failed; show it as it is
			continue
		}
		key := e.Package + " " + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Test == "" && e.Action == "fail":
			// A package that failed: tests that never reached a result (the binary
			// crashed, timed out or exited under them) show what they printed.
			r.failures = append(r.failures, unfinished(out, e.Package, panics[e.Package], buffered)...)
			if !r.failed(e.Package) {
				r.failures = append(r.failures, outcome{e.Package, "", cmp.Or(panics[e.Package], "failed (see its output)")})
			}
		case e.Test == "":
			// A package's own lines: "ok  pkg 1.2s", "FAIL pkg", "--- FAIL", a panic.
			if e.Action == "output" && e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
				fmt.Fprint(out, e.Output)
				if strings.HasPrefix(e.Output, "panic: ") && panics[e.Package] == "" {
					panics[e.Package] = strings.TrimSpace(e.Output)
				}
			}
		case e.Action == "output":
			buffered[key] = append(buffered[key], e.Output)
		case e.Action == "fail":
			fmt.Fprint(out, strings.Join(buffered[key], ""))
			r.failures = append(r.failures, outcome{e.Package, e.Test, failReason(buffered[key])})
			delete(buffered, key)
		case e.Action == "skip":
			r.skips = append(r.skips, outcome{e.Package, e.Test, skipReason(buffered[key])})
			delete(buffered, key)
		case e.Action == "pass":
			delete(buffered, key)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testreport: reading go test's output: %v\n", err)
	}
	return r
}

// failed reports whether a test of pkg is among the failures.
func (r results) failed(pkg string) bool {
	return slices.ContainsFunc(r.failures, func(f outcome) bool { return f.pkg == pkg })
}

// unfinished prints, and forgets, the output of pkg's tests that have no result, and
// returns them as failures: what ended the package (panicked, "" if unknown) ended them.
func unfinished(out io.Writer, pkg, panicked string, buffered map[string][]string) []outcome {
	var keys []string
	for k := range buffered {
		if strings.HasPrefix(k, pkg+" ") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var ended []outcome
	for _, k := range keys {
		test := strings.TrimPrefix(k, pkg+" ")
		fmt.Fprintf(out, "--- NO RESULT: %s\n%s", test, strings.Join(buffered[k], ""))
		ended = append(ended, outcome{pkg, test, "no result, its package ended under it: " + cmp.Or(panicked, "see its output")})
		delete(buffered, k)
	}
	return ended
}

// skipReason is what a skipped test logged, without the run and result lines.
func skipReason(lines []string) string {
	reason := messages(lines)
	if len(reason) == 0 {
		return "no reason given"
	}
	return strings.Join(reason, "; ")
}

// failReason is the first of what a failed test logged, or says that it logged nothing of
// its own (a test whose subtests failed).
func failReason(lines []string) string {
	reason := messages(lines)
	for _, l := range lines {
		if strings.Contains(l, "WARNING: DATA RACE") {
			return "the race detector found a data race"
		}
	}
	if len(reason) == 0 {
		return "nothing logged of its own (see its subtests)"
	}
	const most = 300
	first := reason[0]
	if len(first) > most {
		first = first[:most] + "…"
	}
	return first
}

// messages are the lines a test logged, without the run and result lines and without the
// file and line that t.Log puts before each.
func messages(lines []string) []string {
	var reason []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		// "x_test.go:12: reason" -> "reason"
		if _, after, ok := strings.Cut(t, ".go:"); ok {
			if _, msg, ok := strings.Cut(after, ": "); ok {
				t = msg
			}
		}
		reason = append(reason, t)
	}
	return reason
}

// summary is the closing lines: nothing skipped, or every skipped test and why; then, if
// any failed, every failed test and the first thing it said.
func summary(r results) string {
	var b strings.Builder
	if len(r.skips) == 0 {
		b.WriteString("testreport: no test was skipped")
	} else {
		fmt.Fprintf(&b, "testreport: %d tests were SKIPPED:", len(r.skips))
		list(&b, r.skips)
	}
	if len(r.failures) > 0 {
		fmt.Fprintf(&b, "\ntestreport: %d tests FAILED:", len(r.failures))
		list(&b, r.failures)
	}
	return b.String()
}

// list writes one indented line per outcome.
func list(b *strings.Builder, outcomes []outcome) {
	for _, o := range outcomes {
		fmt.Fprintf(b, "\n  %s %s: %s", o.pkg, cmp.Or(o.test, "(the package)"), o.reason)
	}
}
