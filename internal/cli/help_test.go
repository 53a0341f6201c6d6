package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

// commandPaths lists every command of the tree as the words that name it,
// with a value for each positional argument (so that, were --help ignored,
// the command would have what it needs to run).
func commandPaths(t *testing.T, positional func(name string) string) [][]string {
	t.Helper()
	var root CLI
	parser, err := newParser(&root, &Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	var walk func(n *kong.Node, path []string)
	walk = func(n *kong.Node, path []string) {
		if n.Type == kong.CommandNode {
			path = append(append([]string(nil), path...), n.Name)
			args := append([]string(nil), path...)
			for _, p := range n.Positional {
				args = append(args, positional(p.Name))
			}
			out = append(out, args)
		}
		for _, c := range n.Children {
			walk(c, path)
		}
	}
	walk(parser.Model.Node, nil)
	return out
}

// snapshot hashes the database files in dir: the database and its WAL,
// where every write lands. The -shm file is left out: it is SQLite's
// shared-memory index of the WAL, which readers update too.
func snapshot(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), "-shm") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = sha256.Sum256(b)
	}
	return out
}

// settled is snapshot once the files have stopped changing: the setup's
// writes are in the WAL at once, and the store's checkpointer copies them
// into the database file within a second (sqlite.checkpointInterval), so
// the files must hold still for longer than that.
func settled(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	const still = 1500 * time.Millisecond
	last, since := snapshot(t, dir), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Since(since) < still; {
		if time.Now().After(deadline) {
			t.Fatalf("the store files in %s kept changing for 30s", dir)
		}
		time.Sleep(100 * time.Millisecond)
		if cur := snapshot(t, dir); !maps.Equal(cur, last) {
			last, since = cur, time.Now()
		}
	}
	return last
}

// TestHelpHasNoSideEffects walks the whole command tree and runs every
// command with --help and -h, pointed at a live control plane: each prints
// its usage and exits 0, the store stays byte-for-byte the same, and
// nothing is created in the working directory (drover dev's state).
func TestHelpHasNoSideEffects(t *testing.T) {
	dbDir := t.TempDir()
	apiURL, token := startServerAt(t, filepath.Join(dbDir, "d.db"))
	for _, setup := range [][]string{{"hosts", "create", "web-1"}, {"hosts", "create", "web-2"}} {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), append(setup, "--api", apiURL, "--token", token), &Env{Stdout: &out, Stderr: &errb}); code != 0 {
			t.Fatalf("%v: exit %d: %s", setup, code, errb.String())
		}
	}
	t.Setenv("DROVER_API", apiURL)
	t.Setenv("DROVER_TOKEN", token)
	cwd := t.TempDir()
	t.Chdir(cwd)
	before := settled(t, dbDir)

	// Real names where a command acts on something that exists, so that an
	// ignored --help would change the store.
	paths := commandPaths(t, func(name string) string {
		switch name {
		case "host-id", "host":
			return "web-1"
		}
		return "help-probe"
	})
	paths = append(paths, []string{"hosts", "create", "fresh-1"}, []string{"hosts", "revoke", "web-2"},
		[]string{"token", "create", "extra", "--store", "sqlite:" + filepath.Join(dbDir, "d.db")})
	if len(paths) < 30 {
		t.Fatalf("walked only %d commands", len(paths))
	}
	for _, p := range paths {
		for _, help := range []string{"--help", "-h"} {
			args := append(append([]string(nil), p...), help)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var out, errb bytes.Buffer
			code := Run(ctx, args, &Env{Stdout: &out, Stderr: &errb, Stdin: strings.NewReader("y\n"), Interactive: true})
			cancel()
			if code != 0 {
				t.Errorf("drover %s: exit %d, want 0\nstderr: %s", strings.Join(args, " "), code, errb.String())
			}
			if !strings.Contains(out.String(), "Usage: drover "+p[0]) {
				t.Errorf("drover %s: no usage on stdout:\n%s", strings.Join(args, " "), out.String())
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	after := snapshot(t, dbDir)
	if len(after) != len(before) {
		t.Errorf("store files changed: %d before, %d after", len(before), len(after))
	}
	for name, sum := range before {
		if after[name] != sum {
			t.Errorf("store file %s changed while printing help", name)
		}
	}
	if entries, _ := os.ReadDir(cwd); len(entries) != 0 {
		t.Errorf("help created %v in the working directory", entries)
	}
}

// TestIrreversibleCommandsConfirm: hosts revoke, keys rotate and token
// revoke ask on a terminal, refuse without one, and run with --yes.
func TestIrreversibleCommandsConfirm(t *testing.T) {
	apiURL, token := startServer(t)
	run := func(stdin string, interactive bool, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", apiURL, "--token", token),
			&Env{Stdin: strings.NewReader(stdin), Interactive: interactive, Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	for _, id := range []string{"web-1", "web-2", "web-3"} {
		if code, _, e := run("", false, "hosts", "create", id); code != 0 {
			t.Fatal(e)
		}
	}
	revoked := func(id string) bool {
		_, out, _ := run("", false, "hosts", "show", id)
		return strings.Contains(out, "revoked:         true")
	}

	if code, _, e := run("", false, "hosts", "revoke", "web-1"); code == 0 || !strings.Contains(e, "--yes") {
		t.Fatalf("revoke without a terminal or --yes: exit %d, %s", code, e)
	}
	if code, _, e := run("no\n", true, "hosts", "revoke", "web-1"); code == 0 || !strings.Contains(e, "not confirmed") {
		t.Fatalf("revoke answered no: exit %d, %s", code, e)
	}
	if revoked("web-1") {
		t.Fatal("web-1 revoked without confirmation")
	}
	if code, _, e := run("web-1\n", true, "hosts", "revoke", "web-1"); code != 0 || !strings.Contains(e, `Type "web-1" to confirm`) {
		t.Fatalf("revoke confirmed: exit %d, %s", code, e)
	}
	if code, _, e := run("", false, "hosts", "revoke", "web-2", "--yes"); code != 0 {
		t.Fatalf("revoke --yes: exit %d, %s", code, e)
	}
	if !revoked("web-1") || !revoked("web-2") || revoked("web-3") {
		t.Fatal("confirmed revocations did not take effect, or the wrong host was revoked")
	}

	if code, _, e := run("", false, "keys", "rotate"); code == 0 || !strings.Contains(e, "--yes") {
		t.Fatalf("keys rotate without --yes: exit %d, %s", code, e)
	}
	if code, out, e := run("rotate\n", true, "keys", "rotate"); code != 0 || !strings.Contains(out, "active signing key") {
		t.Fatalf("keys rotate confirmed: exit %d, %s", code, e)
	}

	_, out, _ := run("", false, "token", "list", "--json")
	id := between(out, `"id": "`, `"`)
	if code, _, e := run("", false, "token", "revoke", id); code == 0 || !strings.Contains(e, "--yes") {
		t.Fatalf("token revoke without --yes: exit %d, %s", code, e)
	}
	if code, _, e := run("", false, "token", "revoke", id, "-y"); code != 0 {
		t.Fatalf("token revoke -y: exit %d, %s", code, e)
	}
}

func between(s, start, end string) string {
	_, after, _ := strings.Cut(s, start)
	v, _, _ := strings.Cut(after, end)
	return v
}

// TestDevNullIsNotATerminal: a script whose stdin is /dev/null (a
// character device) is not asked for confirmation; it needs --yes.
func TestDevNullIsNotATerminal(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) {
		t.Fatalf("%s is taken for a terminal", os.DevNull)
	}
}
