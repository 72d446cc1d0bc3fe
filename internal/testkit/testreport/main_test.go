package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	for _, tc := range []struct {
		name, in, wantOut, wantSummary string
	}{
		{
			name: "passing_package_prints_its_closing_line_only",
			in: `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.01s\n"}
{"Action":"pass","Package":"p"}`,
			wantOut:     "ok  \tp\t0.01s\n",
			wantSummary: "testreport: no test was skipped",
		},
		{
			name: "skip_is_listed_with_its_reason",
			in: `{"Action":"run","Package":"p","Test":"TestHAProxy"}
{"Action":"output","Package":"p","Test":"TestHAProxy","Output":"=== RUN   TestHAProxy\n"}
{"Action":"output","Package":"p","Test":"TestHAProxy","Output":"    haproxy_test.go:40: haproxy is not installed\n"}
{"Action":"output","Package":"p","Test":"TestHAProxy","Output":"--- SKIP: TestHAProxy (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestHAProxy"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.01s\n"}`,
			wantOut:     "ok  \tp\t0.01s\n",
			wantSummary: "testreport: 1 tests were SKIPPED:\n  p TestHAProxy: haproxy is not installed",
		},
		{
			name: "failure_prints_the_test_output",
			in: `{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Test":"TestB","Output":"=== RUN   TestB\n"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: want 1, got 2\n"}
{"Action":"output","Package":"p","Test":"TestB","Output":"--- FAIL: TestB (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"output","Package":"p","Output":"FAIL\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}
{"Action":"fail","Package":"p"}`,
			wantOut:     "=== RUN   TestB\n    b_test.go:9: want 1, got 2\n--- FAIL: TestB (0.00s)\nFAIL\nFAIL\tp\t0.01s\n",
			wantSummary: "testreport: no test was skipped\ntestreport: 1 tests FAILED:\n  p TestB: want 1, got 2",
		},
		{
			name: "a_failed_package_shows_its_tests_without_a_result",
			in: `{"Action":"run","Package":"p","Test":"TestC"}
{"Action":"output","Package":"p","Test":"TestC","Output":"=== RUN   TestC\n"}
{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:3: still waiting\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}
{"Action":"fail","Package":"p"}`,
			wantOut:     "FAIL\tp\t0.01s\n--- NO RESULT: TestC\n=== RUN   TestC\n    c_test.go:3: still waiting\n",
			wantSummary: "testreport: no test was skipped\ntestreport: 1 tests FAILED:\n  p TestC: no result, its package ended under it: see its output",
		},
		{
			name: "a_timeout_names_the_test_it_ended_and_why",
			in: `{"Action":"run","Package":"p","Test":"TestHang"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"p","Output":"panic: test timed out after 20m0s\n"}
{"Action":"output","Package":"p","Output":"\trunning tests:\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t1200.01s\n"}
{"Action":"fail","Package":"p"}`,
			wantOut:     "panic: test timed out after 20m0s\n\trunning tests:\nFAIL\tp\t1200.01s\n--- NO RESULT: TestHang\n=== RUN   TestHang\n",
			wantSummary: "testreport: no test was skipped\ntestreport: 1 tests FAILED:\n  p TestHang: no result, its package ended under it: panic: test timed out after 20m0s",
		},
		{
			name: "a_subtest_failure_names_both_and_a_race_says_so",
			in: `{"Action":"run","Package":"p","Test":"TestD"}
{"Action":"run","Package":"p","Test":"TestD/one"}
{"Action":"output","Package":"p","Test":"TestD/one","Output":"==================\n"}
{"Action":"output","Package":"p","Test":"TestD/one","Output":"WARNING: DATA RACE\n"}
{"Action":"output","Package":"p","Test":"TestD/one","Output":"    --- FAIL: TestD/one (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestD/one"}
{"Action":"output","Package":"p","Test":"TestD","Output":"--- FAIL: TestD (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestD"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}
{"Action":"fail","Package":"p"}`,
			wantOut:     "==================\nWARNING: DATA RACE\n    --- FAIL: TestD/one (0.00s)\n--- FAIL: TestD (0.00s)\nFAIL\tp\t0.01s\n",
			wantSummary: "testreport: no test was skipped\ntestreport: 2 tests FAILED:\n  p TestD/one: the race detector found a data race\n  p TestD: nothing logged of its own (see its subtests)",
		},
		{
			name: "a_package_that_fails_without_a_test_says_how",
			in: `{"Action":"output","Package":"p","Output":"panic: boom\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.01s\n"}
{"Action":"fail","Package":"p"}`,
			wantOut:     "panic: boom\nFAIL\tp\t0.01s\n",
			wantSummary: "testreport: no test was skipped\ntestreport: 1 tests FAILED:\n  p (the package): panic: boom",
		},
		{
			name:        "build_failure_and_plain_text_are_shown",
			in:          "{\"Action\":\"build-output\",\"ImportPath\":\"p\",\"Output\":\"p/x.go:1:1: syntax error\\n\"}\ngo: some error",
			wantOut:     "p/x.go:1:1: syntax error\ngo: some error\n",
			wantSummary: "testreport: no test was skipped",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			r := report(strings.NewReader(tc.in), &out)
			if out.String() != tc.wantOut {
				t.Errorf("output:\n%q\nwant:\n%q", out.String(), tc.wantOut)
			}
			if got := summary(r); got != tc.wantSummary {
				t.Errorf("summary:\n%s\nwant:\n%s", got, tc.wantSummary)
			}
		})
	}
}
