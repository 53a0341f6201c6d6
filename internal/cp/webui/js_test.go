package webui

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// node is a test dependency only: it is not needed to build, serve or use
// the console, so these tests skip without it when run by hand. scripts/test
// runs them in a step of their own, and under CI=true (where .ci/run
// installs nodejs) a skip fails the run.

// nodeModuleDir copies the console's own JavaScript (not the vendored
// bundles) and testdata/*.test.mjs into a temporary directory marked as an
// ES module package, so node parses the files as the browser does.
func nodeModuleDir(t *testing.T) (node, dir string, own []string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; skipping the JavaScript lint (not needed to build or serve the console)")
	}
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"type":"module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range embeddedFiles(t) {
		if path.Ext(name) != ".js" || strings.HasPrefix(name, "vendor/") {
			continue
		}
		data, err := assets.ReadFile("static/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		own = append(own, name)
	}
	tests, err := filepath.Glob(filepath.Join("testdata", "*.test.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tests {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return node, dir, own
}

func TestJSSyntax(t *testing.T) {
	node, dir, own := nodeModuleDir(t)
	if len(own) == 0 {
		t.Fatal("no JavaScript files found")
	}
	for _, name := range own {
		out, err := exec.Command(node, "--check", filepath.Join(dir, name)).CombinedOutput()
		if err != nil {
			t.Errorf("node --check %s: %v\n%s", name, err, out)
		}
	}
}

// TestJSLogic runs testdata/*.test.mjs with node's test runner: frames,
// control messages, the resize gate, the output queue and asciicast
// playback, the parts of the pages that need no browser.
func TestJSLogic(t *testing.T) {
	node, dir, _ := nodeModuleDir(t)
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	if m := regexp.MustCompile(`^v(\d+)\.`).FindSubmatch(out); m == nil {
		t.Skipf("cannot read node version %q", out)
	} else if major, _ := strconv.Atoi(string(m[1])); major < 18 {
		// node:test and --test-reporter=tap: 18.15 and later (Debian 12 has 18.20).
		t.Skipf("node %s has no test runner; need 18.15+", strings.TrimSpace(string(out)))
	}
	tests, _ := filepath.Glob(filepath.Join(dir, "*.test.mjs"))
	if len(tests) == 0 {
		t.Fatal("no testdata/*.test.mjs")
	}
	cmd := exec.Command(node, append([]string{"--test", "--test-reporter=tap"}, tests...)...)
	cmd.Dir = dir
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^# pass [1-9]`).Match(out) || !regexp.MustCompile(`(?m)^# fail 0$`).Match(out) {
		t.Fatalf("node --test ran no passing tests:\n%s", out)
	}
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}
