// Package goldentest runs golden Caddyfile adapt tests: each file is a Caddyfile, a line
// `----------`, and the JSON that `caddy adapt --pretty` prints for it or, for a Caddyfile
// that must not adapt, the error that `caddy adapt` reports.
package goldentest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// Read splits a golden file into its Caddyfile and its expected JSON or error.
func Read(t testing.TB, path string) (caddyfileText, expected string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	cf, js, ok := strings.Cut(text, "\n----------\n")
	if !ok {
		t.Fatalf("%s: no line `----------` between the Caddyfile and the JSON", path)
	}
	return strings.TrimSpace(cf) + "\n", strings.TrimSpace(js)
}

// Adapt adapts a Caddyfile to JSON as `caddy adapt` does.
func Adapt(t testing.TB, text string) ([]byte, []caddyconfig.Warning, error) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("the caddyfile adapter is not registered")
	}
	return adapter.Adapt([]byte(text), nil)
}

// RunDir runs every *.caddyfiletest file under dir as a subtest named by its path.
func RunDir(t *testing.T, dir string) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".caddyfiletest") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no golden files in %s", dir)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.ToSlash(strings.TrimPrefix(path, dir+string(filepath.Separator))), ".caddyfiletest")
		t.Run(name, func(t *testing.T) {
			cf, expected := Read(t, path)
			if strings.HasPrefix(expected, "{") {
				if !caddytest.CompareAdapt(t, path, cf, "caddyfile", expected) {
					t.Errorf("%s: the adapted JSON differs from the expected JSON (diff on stdout)", path)
				}
				return
			}
			// As in Caddy's own runner, anything but JSON below the line is the error that
			// adapting must report. The goldens hold the whole message, line number included,
			// so a change to its wording or position shows up here.
			_, _, err := Adapt(t, cf)
			if err == nil {
				t.Fatalf("%s: adapted without error; want:\n%s", path, expected)
			}
			if !strings.Contains(err.Error(), expected) {
				t.Errorf("%s: got error:\n%s\nwant one containing:\n%s", path, err, expected)
			}
		})
	}
}
