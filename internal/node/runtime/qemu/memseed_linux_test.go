package qemu

import (
	"bytes"
	"encoding/base64"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// seedBytes is the seed QEMU gets for id: the in-memory one (read through
// its memfd), which must be the only copy.
func seedBytes(t *testing.T, r *Runtime, id string) []byte {
	t.Helper()
	in := r.get(id)
	in.mu.Lock()
	st, seed := in.st, in.seed
	in.mu.Unlock()
	if !st.SeedInMemory || seed == nil || st.Seed != "" {
		t.Fatalf("seed: in memory %v (file %q, fd %v), want only in memory", st.SeedInMemory, st.Seed, seed != nil)
	}
	for _, n := range []string{seedName, configDriveName} {
		b, err := os.ReadFile(in.path(n))
		if err == nil && bytes.Contains(b, []byte(`"secrets"`)) {
			t.Errorf("%s on disk carries secrets", n)
		}
	}
	b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(seed.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// noSecretOnDisk fails if any file under dirs holds secret (as is or in
// base64, as cloud-init's user-data has it), or a seed workspace is left
// on /dev/shm.
func noSecretOnDisk(t *testing.T, secret []byte, dirs ...string) {
	t.Helper()
	if left, _ := filepath.Glob("/dev/shm/drover-seed-*"); len(left) > 0 {
		t.Errorf("seed workspaces left on /dev/shm: %v", left)
	}
	n := 0
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			n++
			if bytes.Contains(b, secret) || bytes.Contains(b, []byte(base64.StdEncoding.EncodeToString(secret))) {
				t.Errorf("%s holds the secret", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n == 0 {
		t.Errorf("no files under %s", strings.Join(dirs, ", "))
	}
}
