package atomicfile

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, tc := range []struct {
		data string
		perm os.FileMode
	}{{"one", 0o600}, {"two, longer", 0o644}} {
		if err := Write(path, []byte(tc.data), tc.perm); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || string(b) != tc.data {
			t.Fatalf("content %q, %v; want %q", b, err, tc.data)
		}
		if fi, _ := os.Stat(path); runtime.GOOS != "windows" && fi.Mode().Perm() != tc.perm {
			t.Errorf("mode %v, want %v", fi.Mode().Perm(), tc.perm)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("dir holds %d entries, want only the file (no temporaries)", len(ents))
	}
}

func TestWriteFailureLeavesOldContent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x")
	if err := Write(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A directory where the target is cannot be replaced by a file.
	target := filepath.Join(dir, "sub")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "keep"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("new"), 0o600); err == nil {
		t.Fatal("replacing a non-empty directory succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("dir holds %d entries after a failed write, want 2 (temporary removed)", len(ents))
	}
	if err := Write(filepath.Join(dir, "missing", "x"), []byte("y"), 0o600); err == nil {
		t.Error("write into a missing directory succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("old file changed: %q", b)
	}
}
