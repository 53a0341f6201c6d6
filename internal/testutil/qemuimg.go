package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// QEMUImg returns qemu-img's path, skipping the test without it (failing it
// when CI=true, where .ci/run installs it).
func QEMUImg(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("qemu-img not found (required when CI=true)")
		}
		t.Skip("qemu-img not found on PATH")
	}
	return p
}

// RunQEMUImg runs qemu-img with args, failing the test on error.
func RunQEMUImg(t testing.TB, qemuImg string, args ...string) {
	t.Helper()
	if out, err := exec.Command(qemuImg, args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
}
