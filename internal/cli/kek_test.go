package cli

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/drover-dev/drover/internal/cp/kek"
)

func runDrover(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &Env{Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

// testKEK is a key-encryption key for a test server.
func testKEK(t *testing.T) *kek.Ring {
	t.Helper()
	k, err := kek.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return kek.NewRing(k)
}

func writeKEK(t *testing.T, dir, name string, b byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(hex.EncodeToString(bytes.Repeat([]byte{b}, 32))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOfflineTokenCreateUsesKEK: `drover token create --store` opens the
// store's private keys like the server does: it needs the KEK (flag, env or
// systemd credential), refuses a wrong one, and runs without one only with
// --insecure-plaintext-keys on a store whose keys are not encrypted.
func TestOfflineTokenCreateUsesKEK(t *testing.T) {
	t.Setenv("DROVER_KEK_FILE", "")
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	dir := t.TempDir()
	a, b := writeKEK(t, dir, "a", 1), writeKEK(t, dir, "b", 2)
	store := "sqlite:" + filepath.Join(dir, "d.db")

	code, _, stderr := runDrover(t, "token", "create", "first", "--store", store)
	if code == 0 || !strings.Contains(stderr, "--kek-file") || !strings.Contains(stderr, "--insecure-plaintext-keys") {
		t.Fatalf("no KEK: exit %d, stderr %q", code, stderr)
	}
	if code, out, stderr := runDrover(t, "token", "create", "first", "--store", store, "--kek-file", a); code != 0 || !strings.Contains(out, "drv_op_") {
		t.Fatalf("with --kek-file: exit %d %s %s", code, out, stderr)
	}
	for name, args := range map[string][]string{
		"wrong KEK":               {"--kek-file", b},
		"plaintext on encrypted":  {"--insecure-plaintext-keys"},
		"both flags":              {"--kek-file", a, "--insecure-plaintext-keys"},
		"previous without a KEK":  {"--previous-kek-file", a},
		"unreadable KEK file":     {"--kek-file", filepath.Join(dir, "missing")},
		"KEK file of wrong shape": {"--kek-file", store[len("sqlite:"):]},
	} {
		code, _, stderr := runDrover(t, append([]string{"token", "create", "x-" + name, "--store", store}, args...)...)
		if code == 0 || !strings.Contains(stderr, "kek") {
			t.Errorf("%s: exit %d, stderr %q", name, code, stderr)
		}
	}
	t.Setenv("DROVER_KEK_FILE", a)
	if code, _, stderr := runDrover(t, "token", "create", "second", "--store", store); code != 0 {
		t.Fatalf("with DROVER_KEK_FILE: exit %d %s", code, stderr)
	}
	t.Setenv("DROVER_KEK_FILE", "")
	cred := t.TempDir()
	if err := os.Rename(a, filepath.Join(cred, "drover-kek")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", cred)
	if code, _, stderr := runDrover(t, "token", "create", "third", "--store", store); code != 0 {
		t.Fatalf("with the systemd credential: exit %d %s", code, stderr)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	plain := "sqlite:" + filepath.Join(dir, "plain.db")
	if code, _, stderr := runDrover(t, "token", "create", "p", "--store", plain, "--insecure-plaintext-keys"); code != 0 {
		t.Fatalf("--insecure-plaintext-keys on a fresh store: exit %d %s", code, stderr)
	}
}

// TestKeysRotateKEK: after `drover keys rotate-kek` only the new KEK opens
// the store; running it again changes nothing.
func TestKeysRotateKEK(t *testing.T) {
	t.Setenv("DROVER_KEK_FILE", "")
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	dir := t.TempDir()
	oldKEK, newKEK := writeKEK(t, dir, "old", 3), writeKEK(t, dir, "new", 4)
	store := "sqlite:" + filepath.Join(dir, "d.db")
	if code, _, stderr := runDrover(t, "token", "create", "a", "--store", store, "--kek-file", oldKEK); code != 0 {
		t.Fatal(stderr)
	}
	code, out, stderr := runDrover(t, "keys", "rotate-kek", "--store", store, "--old-kek-file", oldKEK, "--new-kek-file", newKEK)
	if code != 0 || !strings.Contains(out, "2 private keys re-encrypted") {
		t.Fatalf("rotate-kek: exit %d %q %q", code, out, stderr)
	}
	if code, _, _ := runDrover(t, "token", "create", "b", "--store", store, "--kek-file", oldKEK); code == 0 {
		t.Fatal("the old KEK still opens the store")
	}
	if code, _, stderr := runDrover(t, "token", "create", "c", "--store", store, "--kek-file", newKEK); code != 0 {
		t.Fatalf("new KEK: %s", stderr)
	}
	if code, out, _ := runDrover(t, "keys", "rotate-kek", "--store", store, "--old-kek-file", oldKEK, "--new-kek-file", newKEK); code != 0 || !strings.Contains(out, "0 private keys") {
		t.Fatalf("second rotate-kek: exit %d %q", code, out)
	}
	if code, _, stderr := runDrover(t, "keys", "rotate-kek", "--store", store, "--old-kek-file", newKEK, "--new-kek-file", newKEK); code == 0 || !strings.Contains(stderr, "same key") {
		t.Fatalf("rotate-kek to the same key: exit %d %q", code, stderr)
	}
}

// TestDevDefaults: drover dev binds the node listener to loopback unless
// told otherwise, and keeps a 0600 KEK in its state directory.
func TestDevDefaults(t *testing.T) {
	t.Setenv("DROVER_NODE_LISTEN", "")
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{nil, "", "127.0.0.1:8443"},
		{[]string{"--node-listen", ":9443"}, "", ":9443"},
		{nil, "0.0.0.0:7443", "0.0.0.0:7443"},
	} {
		t.Setenv("DROVER_NODE_LISTEN", tc.env)
		var root CLI
		p, err := kong.New(&root, kong.Name("drover"), devRuntimeVars())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Parse(append([]string{"dev"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		root.Dev.setDevDefaults()
		if root.Dev.NodeListen != tc.want {
			t.Errorf("dev %v (env %q): node listener %q, want %q", tc.args, tc.env, root.Dev.NodeListen, tc.want)
		}
	}
	path := filepath.Join(t.TempDir(), "kek")
	r1, err := devKEK(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("dev KEK file: %v mode %v size %d", err, fi.Mode(), fi.Size())
	}
	r2, err := devKEK(path)
	if err != nil || r2.PrimaryID() != r1.PrimaryID() {
		t.Fatalf("second start got another KEK: %v", err)
	}
}
