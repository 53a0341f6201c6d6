// Package testutil holds helpers shared by Drover's tests: golden-file
// comparison, the expected GPU count of the machine running real-host
// tests, qemu-img, a slow client for listener limits, an API request
// served by a handler, a settled goroutine count, skipping (or failing
// under CI) a test the machine cannot run, re-running a test in a
// network namespace of its own, and a buffer another goroutine may write
// while the test reads it.
// Only _test.go files may import it.
package testutil

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// CheckGolden compares got with the golden file at path, or rewrites the
// file when update is set (the packages' -update flag).
func CheckGolden(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update creates it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n%s", path, LineDiff(string(want), string(got)))
	}
}

// LineDiff lists the lines that differ, "-want" then "+got".
func LineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n-%s\n+%s\n", i+1, wl, gl)
		}
	}
	return b.String()
}

// ExpectedGPUs is how many GPUs real-host tests expect: 0, unless
// DROVER_TEST_GPU_COUNT says how many this machine has.
func ExpectedGPUs(t testing.TB) int {
	t.Helper()
	s := os.Getenv("DROVER_TEST_GPU_COUNT")
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("DROVER_TEST_GPU_COUNT=%q: %v", s, err)
	}
	return n
}

// SkipOrFail skips a test that lacks a capability of the machine (root, a
// tool, a kernel feature), or fails it under CI=true, where a skip would
// hide a missing install step.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}
