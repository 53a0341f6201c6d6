package osuser

import (
	"context"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// afterPhase returns a progress func that runs fn once phase has finished.
func afterPhase(phase string, fn func()) func(string, time.Duration, error) {
	return func(p string, _ time.Duration, err error) {
		if p == phase && err == nil {
			fn()
		}
	}
}

// TestProvisionRollsBackCreatedUser: a provision that fails after useradd
// deletes the user it created, with its home, authorized_keys, sudoers
// drop-in and state record.
func TestProvisionRollsBackCreatedUser(t *testing.T) {
	home := func(e *fakeEnv) string { return filepath.Join(e.host.base, "home", "alice") }
	tests := []struct {
		name     string
		setup    func(e *fakeEnv)
		progress func(e *fakeEnv) func(string, time.Duration, error)
		code     string
	}{
		{"visudo rejects the drop-in", func(e *fakeEnv) { e.host.fail["visudo"] = exitErr(1) }, nil, CodeSudoersInvalid},
		{"no sudoers dir", func(e *fakeEnv) { _ = os.Remove(e.sudoers) }, nil, CodeSudoersInvalid},
		{"useradd creates the user, then fails", func(e *fakeEnv) {
			e.host.failAfter = map[string]error{"useradd": exitErr(12)}
		}, nil, CodeUseraddFailed},
		{".ssh is not a directory", nil, func(e *fakeEnv) func(string, time.Duration, error) {
			return afterPhase("create_user", func() { writeTestFile(t, filepath.Join(home(e), ".ssh"), "x") })
		}, CodeAuthorizedKeysFailed},
		{"verification fails", nil, func(e *fakeEnv) func(string, time.Duration, error) {
			return afterPhase("sudoers", func() {
				if err := os.Chmod(filepath.Join(home(e), authorizedKeysPath), 0o644); err != nil {
					t.Fatal(err)
				}
			})
		}, CodeVerifyFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			var progress func(string, time.Duration, error)
			if tc.progress != nil {
				progress = tc.progress(e)
			}
			var phases []string
			res, timings, err := e.m.Provision(context.Background(), ProvisionRequest{AllocationID: "a", Username: "alice",
				SSHAuthorizedKeys: []string{keyA}, Sudo: true}, func(p string, d time.Duration, err error) {
				phases = append(phases, p)
				if progress != nil {
					progress(p, d, err)
				}
			})
			wantCode(t, err, tc.code)
			if !res.RolledBack || !strings.Contains(err.Error(), "rolled back: deleted user alice") ||
				phases[len(phases)-1] != "rollback" || timings["rollback_ms"] < 0 {
				t.Errorf("res = %+v, err = %v, phases %v", res, err, phases)
			}
			if _, ok := e.host.users["alice"]; ok {
				t.Error("the user is still there")
			}
			if !contains(e.host.calls, "userdel --remove alice") {
				t.Errorf("calls = %q", e.host.calls)
			}
			if _, err := os.Lstat(home(e)); !os.IsNotExist(err) {
				t.Errorf("home left behind: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(e.sudoers, "drover-alice")); !os.IsNotExist(err) {
				t.Errorf("sudoers drop-in left behind: %v", err)
			}
			if st, _ := e.m.loadState(); len(st.Users) != 0 {
				t.Errorf("state records left: %+v", st.Users)
			}
		})
	}
}

// TestProvisionRollbackKeepsExistingUser: when reprovisioning a user
// Drover created earlier fails, the user stays and its authorized_keys,
// sudoers drop-in and record are put back as they were.
func TestProvisionRollbackKeepsExistingUser(t *testing.T) {
	tests := []struct {
		name   string
		first  ProvisionRequest
		second ProvisionRequest
		fail   func(e *fakeEnv, home string) func(string, time.Duration, error)
		code   string
	}{
		{"sudo granted, visudo rejects",
			ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: []string{keyA}},
			ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: []string{keyB}, Sudo: true},
			func(e *fakeEnv, _ string) func(string, time.Duration, error) {
				e.host.fail["visudo"] = exitErr(1)
				return nil
			}, CodeSudoersInvalid},
		{"sudo revoked, verification fails",
			ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: []string{keyA}, Sudo: true},
			ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: []string{keyA, keyB}},
			func(e *fakeEnv, home string) func(string, time.Duration, error) {
				return afterPhase("sudoers", func() {
					if err := os.Chmod(filepath.Join(home, authorizedKeysPath), 0o644); err != nil {
						t.Fatal(err)
					}
				})
			}, CodeVerifyFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t)
			ctx := context.Background()
			res, _, err := e.m.Provision(ctx, tc.first, nil)
			if err != nil {
				t.Fatal(err)
			}
			keysPath := filepath.Join(res.Home, authorizedKeysPath)
			sudoersPath := filepath.Join(e.sudoers, "drover-alice")
			keysBefore, _ := os.ReadFile(keysPath)
			sudoBefore, sudoErr := os.ReadFile(sudoersPath)
			stBefore, _ := e.m.loadState()
			res2, _, err := e.m.Provision(ctx, tc.second, tc.fail(e, res.Home))
			wantCode(t, err, tc.code)
			if !res2.RolledBack || res2.Created || contains(e.host.calls, "userdel") {
				t.Errorf("res = %+v, calls %q", res2, e.host.calls)
			}
			if _, ok := e.host.users["alice"]; !ok {
				t.Fatal("the existing user was deleted")
			}
			if b, err := os.ReadFile(keysPath); err != nil || string(b) != string(keysBefore) {
				t.Errorf("authorized_keys = %q, %v; want %q", b, err, keysBefore)
			}
			checkMode(t, keysPath, 0o600)
			if b, err := os.ReadFile(sudoersPath); (err == nil) != (sudoErr == nil) || string(b) != string(sudoBefore) {
				t.Errorf("sudoers drop-in = %q, %v; want %q, %v", b, err, sudoBefore, sudoErr)
			}
			if st, _ := e.m.loadState(); !reflect.DeepEqual(st, stBefore) {
				t.Errorf("state = %+v, want %+v", st, stBefore)
			}
		})
	}
}

// TestProvisionRollbackLeavesOthersUsers: a failed provision never
// deletes a user it did not create: one adopted from a crashed provision
// (pending record), or one someone else created between validate and
// useradd.
func TestProvisionRollbackLeavesOthersUsers(t *testing.T) {
	t.Run("adopted pending user", func(t *testing.T) {
		e := newFakeEnv(t)
		home := filepath.Join(e.host.base, "home", "alice")
		if err := os.MkdirAll(home, 0o750); err != nil {
			t.Fatal(err)
		}
		e.host.users["alice"] = &user.User{Uid: strconv.Itoa(os.Getuid()), Gid: strconv.Itoa(os.Getgid()), Username: "alice",
			Name: comment("a"), HomeDir: home}
		writeState(t, e, map[string]record{"alice": {AllocationID: "a", Pending: true}})
		e.host.fail["visudo"] = exitErr(1)
		res, _, err := e.m.Provision(context.Background(), ProvisionRequest{AllocationID: "a", Username: "alice",
			SSHAuthorizedKeys: []string{keyA}, Sudo: true}, nil)
		wantCode(t, err, CodeSudoersInvalid)
		if _, ok := e.host.users["alice"]; !ok || contains(e.host.calls, "userdel") || !res.RolledBack {
			t.Fatalf("res = %+v, calls %q", res, e.host.calls)
		}
		if _, err := os.Lstat(filepath.Join(home, ".ssh")); !os.IsNotExist(err) {
			t.Errorf(".ssh made by the failed provision is left: %v", err)
		}
		if st, _ := e.m.loadState(); !st.Users["alice"].Pending {
			t.Errorf("record = %+v, want the pending record back", st.Users)
		}
	})
	t.Run("user created by someone else meanwhile", func(t *testing.T) {
		e := newFakeEnv(t)
		e.host.beforeRun = func(h *fakeHost, tool string) {
			if tool == "useradd" {
				h.users["alice"] = &user.User{Uid: "1600", Gid: "1600", Username: "alice", Name: "Alice", HomeDir: "/home/alice"}
			}
		}
		_, _, err := e.m.Provision(context.Background(), ProvisionRequest{AllocationID: "a", Username: "alice"}, nil)
		wantCode(t, err, CodeUseraddFailed)
		if u, ok := e.host.users["alice"]; !ok || u.Name != "Alice" || contains(e.host.calls, "userdel") {
			t.Fatalf("someone else's user touched: %+v, calls %q", u, e.host.calls)
		}
		if st, _ := e.m.loadState(); len(st.Users) != 0 {
			t.Errorf("state = %+v", st.Users)
		}
	})
}

// TestProvisionHomeIsPrivate: a new user's home is 0700 whatever mode
// useradd gave it.
func TestProvisionHomeIsPrivate(t *testing.T) {
	e := newFakeEnv(t) // the fake useradd makes homes 0750
	res, _, err := e.m.Provision(context.Background(), ProvisionRequest{AllocationID: "a", Username: "alice"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkMode(t, res.Home, 0o700|os.ModeDir)
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
