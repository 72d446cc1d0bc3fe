package caddyleader

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// readme is README.md with Unix line ends.
func readme(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(data), "\r\n", "\n")
}

// TestReadmeListsEveryModule: the modules README says `caddy list-modules` shows are the
// plugin's modules that list-modules does show (every registered module with "leader" in its
// id), all of them.
func TestReadmeListsEveryModule(t *testing.T) {
	text := readme(t)
	start := strings.Index(text, "`caddy list-modules` then shows")
	if start < 0 {
		t.Fatal("README.md has no sentence starting \"`caddy list-modules` then shows\"")
	}
	sentence, _, _ := strings.Cut(text[start:], ".\n")
	var listed []string
	for _, m := range regexp.MustCompile("`([a-z0-9_.]+)`").FindAllStringSubmatch(sentence, -1) {
		listed = append(listed, m[1])
	}
	var registered []string
	for _, id := range caddy.Modules() {
		// Modules that tests register for themselves (…_test_…) are not in a built Caddy.
		if strings.Contains(id, "leader") && !strings.Contains(id, "_test_") {
			registered = append(registered, id)
		}
	}
	slices.Sort(listed)
	if !slices.Equal(listed, registered) {
		t.Errorf("README.md lists the modules\n%v\nlist-modules shows\n%v", listed, registered)
	}
}

// TestReadmeTestCommand: README gives the one command that sets up and runs every test, and
// .ci/run runs exactly that command.
func TestReadmeTestCommand(t *testing.T) {
	if !strings.Contains(readme(t), "```sh\n./test.sh\n```\n") {
		t.Error("README.md does not give ./test.sh in a ```sh block of its own")
	}
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ci), "readonly test_cmd=(./test.sh)\n") || !strings.Contains(string(ci), `"${test_cmd[@]}"`) {
		t.Error(".ci/run does not run test_cmd=(./test.sh), the README's command")
	}
}

// TestReadmeQuickstart: the quick start uses the caddy leader command, not curl | jq, and
// warns that the local etcd deletes its data.
func TestReadmeQuickstart(t *testing.T) {
	text := readme(t)
	start, end := strings.Index(text, "## Quick start"), strings.Index(text, "## The modules at a glance")
	if start < 0 || end < start {
		t.Fatal("README.md has no Quick start section before The modules at a glance")
	}
	quick := text[start:end]
	for _, want := range []string{"./caddy leader status", "./caddy leader transfer --to", "deletes its data", "XCADDY_ETCD_DATA"} {
		if !strings.Contains(quick, want) {
			t.Errorf("the quick start does not say %q", want)
		}
	}
	if strings.Contains(quick, "| jq") {
		t.Error("the quick start still pipes curl into jq")
	}
}

// TestReadmeCaddyfilesFormatted: every Caddyfile the README shows is written as `caddy fmt`
// writes it, so that one copied into a file loads without Caddy's "input is not formatted"
// warning.
func TestReadmeCaddyfilesFormatted(t *testing.T) {
	text := readme(t)
	for _, m := range caddyfileBlock.FindAllStringSubmatchIndex(text, -1) {
		block := text[m[2]:m[3]]
		line := strings.Count(text[:m[0]], "\n") + 2 // the block's first line
		if w, different := caddyfile.FormattingDifference("README.md", []byte(block)); different {
			t.Errorf("README.md:%d: the Caddyfile block is not formatted as `caddy fmt` would (its line %d differs)", line, w.Line)
		}
	}
}

// TestReadmeStaysAGuide: the README is the way in, read top to bottom; detail belongs in docs/.
func TestReadmeStaysAGuide(t *testing.T) {
	const most = 410 // 400, and the short section on scheduled jobs
	if n := strings.Count(readme(t), "\n"); n > most {
		t.Errorf("README.md has %d lines, more than %d: move detail to docs/", n, most)
	}
}
