// Command testreport reads `go test -json` on stdin and prints what a plain `go test` prints
// (each package's closing line, and the output of every test that failed), then one line
// that lists the tests that were skipped and why, so that a run that passed by skipping
// says so. It exits 0; the caller takes go test's own exit status.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
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

// skip is one skipped test and the reason it gave.
type skip struct {
	pkg, test, reason string
}

func main() {
	skips := report(os.Stdin, os.Stdout)
	fmt.Println(summary(skips))
}

// report copies the plain go test output from the JSON on in to out and returns the
// skipped tests, in the order they ended.
func report(in io.Reader, out io.Writer) []skip {
	var skips []skip
	buffered := map[string][]string{} // package + test -> its output so far
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
			unfinished(out, e.Package, buffered)
		case e.Test == "":
			// A package's own lines: "ok  pkg 1.2s", "FAIL pkg", "--- FAIL", a panic.
			if e.Action == "output" && e.Output != "PASS\n" && !strings.HasPrefix(e.Output, "=== ") {
				fmt.Fprint(out, e.Output)
			}
		case e.Action == "output":
			buffered[key] = append(buffered[key], e.Output)
		case e.Action == "fail":
			fmt.Fprint(out, strings.Join(buffered[key], ""))
			delete(buffered, key)
		case e.Action == "skip":
			skips = append(skips, skip{e.Package, e.Test, skipReason(buffered[key])})
			delete(buffered, key)
		case e.Action == "pass":
			delete(buffered, key)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(out, "testreport: reading go test's output: %v\n", err)
	}
	return skips
}

// unfinished prints, and forgets, the output of pkg's tests that have no result.
func unfinished(out io.Writer, pkg string, buffered map[string][]string) {
	var keys []string
	for k := range buffered {
		if strings.HasPrefix(k, pkg+" ") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "--- NO RESULT: %s\n%s", strings.TrimPrefix(k, pkg+" "), strings.Join(buffered[k], ""))
		delete(buffered, k)
	}
}

// skipReason is what a skipped test logged, without the run and result lines.
func skipReason(lines []string) string {
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
	if len(reason) == 0 {
		return "no reason given"
	}
	return strings.Join(reason, "; ")
}

// summary is the closing line: nothing skipped, or every skipped test and why.
func summary(skips []skip) string {
	if len(skips) == 0 {
		return "testreport: no test was skipped"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "testreport: %d tests were SKIPPED:", len(skips))
	for _, s := range skips {
		fmt.Fprintf(&b, "\n  %s %s: %s", s.pkg, s.test, s.reason)
	}
	return b.String()
}
