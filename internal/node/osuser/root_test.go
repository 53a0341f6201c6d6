//go:build linux

package osuser

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// newRootManager returns a Manager over the real system tools, or skips
// when the test is not root (fails under CI=true).
func newRootManager(t *testing.T) (*Manager, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: the real user tests must run as root")
		}
		t.Skip("not root: skipping the tests that create real OS users")
	}
	for _, tool := range []string{"useradd", "userdel", "usermod"} {
		if _, err := lookPathSbin(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI=true: %s is required: %v", tool, err)
			}
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
	base := t.TempDir()
	sudoers := filepath.Join(base, "sudoers.d") // never the host's /etc/sudoers.d
	if err := os.Mkdir(sudoers, 0o750); err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{StateDir: filepath.Join(base, "state"), SudoersDir: sudoers,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return m, sudoers
}

// throwawayUser returns an unused name like drovert123456 and removes any
// user of that name when the test ends, whatever happened.
func throwawayUser(t *testing.T) string {
	t.Helper()
	for range 20 {
		n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("drovert%06d", n.Int64())
		if _, err := user.Lookup(name); err == nil {
			continue
		}
		t.Cleanup(func() {
			if _, err := user.Lookup(name); err == nil {
				_ = exec.Command("pkill", "-KILL", "-u", name).Run()
				if out, err := exec.Command("userdel", "--remove", name).CombinedOutput(); err != nil {
					t.Errorf("cleanup: userdel %s: %v: %s", name, err, out)
				}
			}
		})
		return name
	}
	t.Fatal("no free drovert user name")
	return ""
}

func TestRealUserLifecycle(t *testing.T) {
	m, sudoers := newRootManager(t)
	name := throwawayUser(t)
	ctx := context.Background()
	req := ProvisionRequest{AllocationID: "alloc-real-1", Username: name, SSHAuthorizedKeys: []string{keyA, keyB}, Sudo: true}
	res, _, err := m.Provision(ctx, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("user does not resolve: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	if !res.Created || res.UID != uid || res.Home != u.HomeDir || res.Keys != 2 ||
		res.Verified != (Verified{User: true, Home: true, AuthorizedKeys: true}) {
		t.Errorf("Provision = %+v (user %+v)", res, u)
	}
	if u.Name != "drover allocation alloc-real-1" {
		t.Errorf("comment = %q", u.Name)
	}
	if want := "/bin/bash"; isExecutable(want) && res.Shell != want {
		t.Errorf("shell = %q, want %q", res.Shell, want)
	}
	for path, mode := range map[string]os.FileMode{u.HomeDir: 0o700 | os.ModeDir, filepath.Join(u.HomeDir, ".ssh"): 0o700 | os.ModeDir,
		filepath.Join(u.HomeDir, ".ssh/authorized_keys"): 0o600} {
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if owner, _ := fileOwner(fi); owner != uid {
			t.Errorf("%s owned by %d, want %d", path, owner, uid)
		}
		if mode != 0 && fi.Mode() != mode {
			t.Errorf("%s mode %s, want %s", path, fi.Mode(), mode)
		}
	}
	if fi, err := os.Stat(filepath.Join(sudoers, "drover-"+name)); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("sudoers drop-in: %v, %v", fi, err)
	}

	// Idempotent: again with one key, no sudo.
	res, _, err = m.Provision(ctx, ProvisionRequest{AllocationID: "alloc-real-1", Username: name, SSHAuthorizedKeys: []string{keyB}, Shell: "/bin/sh"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Created || res.UID != uid || res.Keys != 1 || res.Shell != "/bin/sh" {
		t.Errorf("second Provision = %+v", res)
	}
	b, err := os.ReadFile(filepath.Join(u.HomeDir, ".ssh/authorized_keys"))
	if err != nil || strings.Contains(string(b), keyA) || !strings.Contains(string(b), keyB) {
		t.Errorf("authorized_keys after reprovision (%v):\n%s", err, b)
	}
	if _, err := os.Stat(filepath.Join(sudoers, "drover-"+name)); !os.IsNotExist(err) {
		t.Errorf("sudoers drop-in not removed: %v", err)
	}
	if out, err := exec.Command("getent", "passwd", name).Output(); err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), ":/bin/sh") {
		t.Errorf("getent passwd %s = %q, %v", name, out, err)
	}

	// Other allocations are refused.
	_, _, err = m.Provision(ctx, ProvisionRequest{AllocationID: "alloc-real-2", Username: name}, nil)
	wantCode(t, err, CodeUserBoundToOtherAllocation)
	_, _, err = m.Deprovision(ctx, DeprovisionRequest{AllocationID: "alloc-real-2", Username: name, RemoveHome: true}, nil)
	wantCode(t, err, CodeUserBoundToOtherAllocation)

	// A process of the user's is killed by deprovision.
	sleeper := exec.Command("setpriv", "--reuid="+u.Uid, "--regid="+u.Gid, "--clear-groups", "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Logf("no user process for the test (setpriv: %v)", err)
		sleeper = nil
	}
	dres, _, err := m.Deprovision(ctx, DeprovisionRequest{AllocationID: "alloc-real-1", Username: name, RemoveHome: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sleeper != nil {
		_ = sleeper.Wait() // returns once the process was killed
	}
	if !dres.Removed || !dres.HomeRemoved || dres.AlreadyAbsent {
		t.Errorf("Deprovision = %+v", dres)
	}
	if _, err := user.Lookup(name); err == nil {
		t.Error("user still resolves")
	}
	if _, err := os.Stat(u.HomeDir); !os.IsNotExist(err) {
		t.Errorf("home still there: %v", err)
	}
	dres, _, err = m.Deprovision(ctx, DeprovisionRequest{AllocationID: "alloc-real-1", Username: name}, nil)
	if err != nil || !dres.AlreadyAbsent {
		t.Errorf("second Deprovision = %+v, %v", dres, err)
	}
}

func TestRealRejects(t *testing.T) {
	m, _ := newRootManager(t)
	ctx := context.Background()
	name := throwawayUser(t)
	system := "daemon"
	if _, err := user.Lookup(system); err != nil {
		system = "nobody"
	}
	tests := []struct {
		name string
		req  ProvisionRequest
		code string
	}{
		{"invalid username", ProvisionRequest{AllocationID: "a", Username: "Bad User"}, CodeInvalidParams},
		{"root", ProvisionRequest{AllocationID: "a", Username: "root"}, CodeInvalidParams},
		{"bad key", ProvisionRequest{AllocationID: "a", Username: name, SSHAuthorizedKeys: []string{"ssh-rsa AAAAB3 x"}}, CodeInvalidParams},
		{"shell not in /etc/shells", ProvisionRequest{AllocationID: "a", Username: name, Shell: "/usr/bin/env"}, CodeInvalidParams},
		{"unmanaged system user", ProvisionRequest{AllocationID: "a", Username: system}, CodeUserExistsUnmanaged},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := m.Provision(ctx, tc.req, nil)
			wantCode(t, err, tc.code)
			if _, err := user.Lookup(name); err == nil {
				t.Errorf("user %s was created", name)
			}
		})
	}
	_, _, err := m.Deprovision(ctx, DeprovisionRequest{AllocationID: "a", Username: system, RemoveHome: true}, nil)
	wantCode(t, err, CodeUserExistsUnmanaged)
	if _, err := user.Lookup(system); err != nil {
		t.Fatalf("%s is gone: %v", system, err)
	}
}
