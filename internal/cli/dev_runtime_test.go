package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDevRuntimeFromRegistry: the values `drover dev --runtime` accepts are
// the names in devRuntimes plus none, --help lists them, and an unknown one
// is refused (exit 2, nothing run) with an error naming the flag and them.
func TestDevRuntimeFromRegistry(t *testing.T) {
	want := append(devRuntimes().Names(), "none")
	if len(want) < 3 {
		t.Fatalf("dev registers %v: want qemu and mock", want)
	}
	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"dev", "--help"}, &Env{Stdout: &out, Stderr: &errOut}); code != 0 {
		t.Fatalf("dev --help: exit %d, stderr %s", code, errOut.String())
	}
	help := out.String()
	i := strings.Index(help, "--runtime")
	if i < 0 {
		t.Fatalf("dev --help has no --runtime:\n%s", help)
	}
	line := help[i+len("--runtime"):]
	if j := strings.Index(line, "--"); j >= 0 {
		line = line[:j] // up to the next flag
	}
	line = strings.Join(strings.Fields(line), " ")
	for _, n := range want {
		if !strings.Contains(line, n) {
			t.Errorf("dev --help --runtime does not list %q:\n%s", n, line)
		}
	}

	out.Reset()
	errOut.Reset()
	code := Run(context.Background(), []string{"dev", "--runtime", "firecracker", "--data-dir", t.TempDir()},
		&Env{Stdout: &out, Stderr: &errOut})
	if code != 2 {
		t.Fatalf("dev --runtime firecracker: exit %d, want 2", code)
	}
	msg := errOut.String()
	if !strings.Contains(msg, "--runtime") || !strings.Contains(msg, "firecracker") {
		t.Errorf("error does not name the flag and the value: %s", msg)
	}
	for _, n := range want {
		if !strings.Contains(msg, `"`+n+`"`) {
			t.Errorf("error does not list %q: %s", n, msg)
		}
	}
}
