//go:build linux

package osuser

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// rejectingVisudo makes m find a visudo that rejects every file, as the
// real one does a drop-in with a syntax error.
func rejectingVisudo(t *testing.T, m *Manager) {
	t.Helper()
	script := filepath.Join(t.TempDir(), "visudo")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"$2:1:1: syntax error\" >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m.opts.LookPath = func(name string) (string, error) {
		if name == "visudo" {
			return script, nil
		}
		return lookPathSbin(name)
	}
}

// userGone checks that name resolves nowhere (getent passwd fails).
func userGone(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("getent", "passwd", name).Output(); err == nil {
		t.Errorf("getent passwd %s = %q: the user still exists", name, out)
	}
	if _, err := user.Lookup(name); err == nil {
		t.Errorf("user %s still resolves", name)
	}
}

// TestRealProvisionRollback: with the real tools, a provision that fails
// after useradd leaves no user, home, sudoers drop-in or record behind.
func TestRealProvisionRollback(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(t *testing.T, m *Manager)
		progress func(t *testing.T, name string) func(string, time.Duration, error)
		code     string
	}{
		{"visudo rejects the drop-in", rejectingVisudo, nil, CodeSudoersInvalid},
		{"no sudoers dir", func(t *testing.T, m *Manager) { m.opts.SudoersDir = filepath.Join(t.TempDir(), "missing") },
			nil, CodeSudoersInvalid},
		{".ssh is not a directory", nil, func(t *testing.T, name string) func(string, time.Duration, error) {
			return afterPhase("create_user", func() {
				u, err := user.Lookup(name)
				if err != nil {
					t.Fatal(err)
				}
				writeTestFile(t, filepath.Join(u.HomeDir, ".ssh"), "x")
			})
		}, CodeAuthorizedKeysFailed},
		{"verification fails", nil, func(t *testing.T, name string) func(string, time.Duration, error) {
			return afterPhase("sudoers", func() {
				u, err := user.Lookup(name)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(filepath.Join(u.HomeDir, authorizedKeysPath), 0o644); err != nil {
					t.Fatal(err)
				}
			})
		}, CodeVerifyFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newRootManager(t)
			name := throwawayUser(t)
			if tc.setup != nil {
				tc.setup(t, m)
			}
			var progress func(string, time.Duration, error)
			if tc.progress != nil {
				progress = tc.progress(t, name)
			}
			var home string
			res, _, err := m.Provision(context.Background(), ProvisionRequest{AllocationID: "alloc-rb", Username: name,
				SSHAuthorizedKeys: []string{keyA}, Sudo: true}, func(p string, d time.Duration, err error) {
				if p == "create_user" && err == nil {
					u, lerr := user.Lookup(name)
					if lerr != nil {
						t.Fatalf("user not created: %v", lerr)
					}
					home = u.HomeDir
				}
				if progress != nil {
					progress(p, d, err)
				}
			})
			wantCode(t, err, tc.code)
			if !res.RolledBack || !strings.Contains(err.Error(), "rolled back: deleted user "+name) {
				t.Errorf("res = %+v, err = %v", res, err)
			}
			if home == "" {
				t.Fatal("the provision never created the user")
			}
			userGone(t, name)
			if _, err := os.Lstat(home); !os.IsNotExist(err) {
				t.Errorf("home %s left behind: %v", home, err)
			}
			if _, err := os.Lstat(m.sudoersPath(name)); !os.IsNotExist(err) {
				t.Errorf("sudoers drop-in left behind: %v", err)
			}
			if st, err := m.loadState(); err != nil || len(st.Users) != 0 {
				t.Errorf("state = %+v, %v", st.Users, err)
			}
		})
	}
}

// TestRealRollbackKeepsExistingUser: a failed reprovision of a user Drover
// created before does not delete it; its keys and sudo go back to what
// they were.
func TestRealRollbackKeepsExistingUser(t *testing.T) {
	m, _ := newRootManager(t)
	name := throwawayUser(t)
	ctx := context.Background()
	res, _, err := m.Provision(ctx, ProvisionRequest{AllocationID: "alloc-rb", Username: name, SSHAuthorizedKeys: []string{keyA}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	keysPath := filepath.Join(res.Home, authorizedKeysPath)
	keysBefore, err := os.ReadFile(keysPath)
	if err != nil {
		t.Fatal(err)
	}
	stBefore, _ := m.loadState()
	rejectingVisudo(t, m)
	res2, _, err := m.Provision(ctx, ProvisionRequest{AllocationID: "alloc-rb", Username: name,
		SSHAuthorizedKeys: []string{keyB}, Sudo: true}, nil)
	wantCode(t, err, CodeSudoersInvalid)
	if !res2.RolledBack {
		t.Errorf("res = %+v", res2)
	}
	if out, err := exec.Command("getent", "passwd", name).Output(); err != nil {
		t.Fatalf("the existing user was deleted: getent = %q, %v", out, err)
	}
	if b, err := os.ReadFile(keysPath); err != nil || string(b) != string(keysBefore) || strings.Contains(string(b), keyB) {
		t.Errorf("authorized_keys = %q, %v; want %q", b, err, keysBefore)
	}
	if _, err := os.Lstat(m.sudoersPath(name)); !os.IsNotExist(err) {
		t.Errorf("sudoers drop-in: %v", err)
	}
	if st, _ := m.loadState(); !reflect.DeepEqual(st, stBefore) {
		t.Errorf("state = %+v, want %+v", st, stBefore)
	}
}
