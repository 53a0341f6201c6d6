//go:build !linux

package qemu

import (
	"os"
	"testing"
)

// seedBytes is the seed QEMU gets for id: without memfd, the 0600 file.
func seedBytes(t *testing.T, r *Runtime, id string) []byte {
	t.Helper()
	in := r.get(id)
	in.mu.Lock()
	path := in.st.Seed
	in.mu.Unlock()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// noSecretOnDisk checks nothing here: without memfd the seed is a 0600
// file in the instance's 0700 directory (docs/secrets.md).
func noSecretOnDisk(*testing.T, []byte, ...string) {}
