package osuser

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	keyA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"
	keyB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcIO2VnxPhL/3vX+MJ6QLi0gYXk9Lz3vcvPg4g4Ya6W bob@desk"
)

// exitErr is a failed command with an exit status.
type exitErr int

func (e exitErr) Error() string { return "exit status " + strconv.Itoa(int(e)) }
func (e exitErr) ExitCode() int { return int(e) }

// fakeHost is a passwd database and the system tools that change it, so
// that the whole flow runs without root: users get the test's own uid
// and homes under a temporary directory.
type fakeHost struct {
	mu       sync.Mutex
	t        *testing.T
	base     string
	users    map[string]*user.User
	calls    []string
	fail     map[string]error // tool → error to return
	missing  map[string]bool  // tools LookPath does not find
	keepHome bool             // userdel --remove leaves the home behind
	// failAfter: tool → error returned after the tool did its work (a
	// useradd that creates the user, then fails on the home).
	failAfter map[string]error
	// beforeRun runs (with mu held) before each tool.
	beforeRun func(h *fakeHost, tool string)
}

func newFakeHost(t *testing.T) *fakeHost {
	base := t.TempDir()
	return &fakeHost{t: t, base: base, fail: map[string]error{}, missing: map[string]bool{},
		users: map[string]*user.User{"daemon": {Uid: "1", Gid: "1", Username: "daemon", Name: "daemon", HomeDir: "/usr/sbin"}}}
}

func (h *fakeHost) lookPath(name string) (string, error) {
	if h.missing[name] {
		return "", fmt.Errorf("%s: not found", name)
	}
	return "/usr/sbin/" + name, nil
}

func (h *fakeHost) lookup(name string) (*user.User, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if u, ok := h.users[name]; ok {
		c := *u
		return &c, nil
	}
	return nil, user.UnknownUserError(name)
}

func (h *fakeHost) run(_ context.Context, path string, args ...string) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	tool := filepath.Base(path)
	h.calls = append(h.calls, tool+" "+strings.Join(args, " "))
	if h.beforeRun != nil {
		h.beforeRun(h, tool)
	}
	if err := h.fail[tool]; err != nil {
		return []byte(tool + ": simulated failure"), err
	}
	name := args[len(args)-1]
	switch tool {
	case "useradd":
		if _, ok := h.users[name]; ok {
			return []byte("useradd: user '" + name + "' already exists"), exitErr(9)
		}
		home := filepath.Join(h.base, "home", name)
		if err := os.MkdirAll(home, 0o750); err != nil {
			return nil, err
		}
		h.users[name] = &user.User{Uid: strconv.Itoa(os.Getuid()), Gid: strconv.Itoa(os.Getgid()),
			Username: name, Name: args[4], HomeDir: home}
	case "userdel":
		u, ok := h.users[name]
		if !ok {
			return []byte("userdel: user '" + name + "' does not exist"), exitErr(6)
		}
		delete(h.users, name)
		if args[0] == "--remove" && !h.keepHome {
			return nil, os.RemoveAll(u.HomeDir)
		}
	case "pkill":
		return nil, exitErr(1) // no process
	}
	if err := h.failAfter[tool]; err != nil {
		return []byte(tool + ": simulated failure after the change"), err
	}
	return nil, nil
}

type fakeEnv struct {
	host     *fakeHost
	m        *Manager
	stateDir string
	sudoers  string
	shells   string
}

func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	h := newFakeHost(t)
	e := &fakeEnv{host: h, stateDir: filepath.Join(h.base, "state"), sudoers: filepath.Join(h.base, "sudoers.d"),
		shells: filepath.Join(h.base, "shells")}
	if err := os.MkdirAll(e.sudoers, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.shells, []byte("# shells\n/bin/sh\n/bin/bash\n/usr/bin/bash\n/usr/bin/bash-nope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := newManager("linux", Options{StateDir: e.stateDir, Run: h.run, LookPath: h.lookPath, LookupUser: h.lookup,
		ShellsFile: e.shells, SudoersDir: e.sudoers, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	return e
}

func TestNewUnsupportedOS(t *testing.T) {
	for _, goos := range []string{"windows", "dragonfly", "darwin"} {
		_, err := newManager(goos, Options{StateDir: t.TempDir()})
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "not supported on "+goos) {
			t.Errorf("%s: err = %v", goos, err)
		}
	}
	if _, err := newManager("linux", Options{}); err == nil {
		t.Error("no StateDir: no error")
	}
}

func TestArgs(t *testing.T) {
	if got, want := useraddArgs("alice", "/bin/bash", "alloc:7"), []string{"--create-home", "--shell", "/bin/bash",
		"--comment", "drover allocation alloc_7", "alice"}; !reflect.DeepEqual(got, want) {
		t.Errorf("useraddArgs = %q, want %q", got, want)
	}
	if got := userdelArgs("alice", true); !reflect.DeepEqual(got, []string{"--remove", "alice"}) {
		t.Errorf("userdelArgs(remove) = %q", got)
	}
	if got := userdelArgs("alice", false); !reflect.DeepEqual(got, []string{"alice"}) {
		t.Errorf("userdelArgs = %q", got)
	}
}

func TestProvisionLifecycleFake(t *testing.T) {
	e := newFakeEnv(t)
	ctx := context.Background()
	var phases []string
	progress := func(p string, _ time.Duration, err error) {
		if err != nil {
			t.Errorf("phase %s: %v", p, err)
		}
		phases = append(phases, p)
	}
	req := ProvisionRequest{AllocationID: "alloc-1", Username: "alice", SSHAuthorizedKeys: []string{keyA, keyB}, Shell: "/bin/sh", Sudo: true}
	res, timings, err := e.m.Provision(ctx, req, progress)
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(e.host.base, "home", "alice")
	want := ProvisionResult{AllocationID: "alloc-1", Username: "alice", UID: os.Getuid(), GID: os.Getgid(), Home: home,
		Shell: "/bin/sh", Keys: 2, Sudo: true, Created: true, Verified: Verified{User: true, Home: true, AuthorizedKeys: true}}
	if res != want {
		t.Errorf("Provision = %+v\nwant %+v", res, want)
	}
	wantPhases := []string{"validate", "create_user", "authorized_keys", "sudoers", "verify"}
	if !reflect.DeepEqual(phases, wantPhases) {
		t.Errorf("phases = %v", phases)
	}
	for _, p := range wantPhases {
		if _, ok := timings[p+"_ms"]; !ok {
			t.Errorf("timings lack %s_ms: %v", p, timings)
		}
	}
	if got := e.host.calls[0]; got != "useradd --create-home --shell /bin/sh --comment drover allocation alloc-1 alice" {
		t.Errorf("first call = %q", got)
	}
	checkMode(t, filepath.Join(home, ".ssh"), 0o700|os.ModeDir)
	checkMode(t, filepath.Join(home, ".ssh/authorized_keys"), 0o600)
	sudoers := filepath.Join(e.sudoers, "drover-alice")
	checkMode(t, sudoers, 0o440)
	if b, _ := os.ReadFile(sudoers); !strings.Contains(string(b), "\nalice ALL=(ALL) NOPASSWD:ALL\n") {
		t.Errorf("sudoers = %q", b)
	}
	if !contains(e.host.calls, "visudo -cf "+filepath.Join(e.sudoers, ".drover-alice.tmp")) {
		t.Errorf("visudo not run: %q", e.host.calls)
	}

	// The user adds a key of their own; a second provision replaces only
	// Drover's keys, updates the shell and drops sudo.
	ak := filepath.Join(home, ".ssh/authorized_keys")
	f, err := os.OpenFile(ak, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	own := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBbOoRMqsyt5fP5GZ1DzCCe1VaZuhVb/oFRXpTWfScxI own@key"
	fmt.Fprintln(f, own)
	f.Close()
	e.host.calls = nil
	req2 := ProvisionRequest{AllocationID: "alloc-1", Username: "alice", SSHAuthorizedKeys: []string{keyB}}
	res, _, err = e.m.Provision(ctx, req2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Created || res.Keys != 1 || res.Shell != "/bin/bash" && res.Shell != "/bin/sh" || !res.Verified.AuthorizedKeys {
		t.Errorf("second Provision = %+v", res)
	}
	if !contains(e.host.calls, "usermod --shell "+res.Shell+" alice") || contains(e.host.calls, "useradd") {
		t.Errorf("calls = %q", e.host.calls)
	}
	b, _ := os.ReadFile(ak)
	if strings.Contains(string(b), keyA) || !strings.Contains(string(b), keyB) || !strings.Contains(string(b), own) ||
		strings.Count(string(b), keysBegin) != 1 {
		t.Errorf("authorized_keys after reprovision:\n%s", b)
	}
	if _, err := os.Stat(sudoers); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sudoers drop-in not removed: %v", err)
	}

	// Another allocation can neither take nor remove alice.
	_, _, err = e.m.Provision(ctx, ProvisionRequest{AllocationID: "alloc-2", Username: "alice"}, nil)
	wantCode(t, err, CodeUserBoundToOtherAllocation)
	_, _, err = e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "alloc-2", Username: "alice", RemoveHome: true}, nil)
	wantCode(t, err, CodeUserBoundToOtherAllocation)

	e.host.calls = nil
	dres, dtimings, err := e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "alloc-1", Username: "alice", RemoveHome: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (DeprovisionResult{AllocationID: "alloc-1", Username: "alice", Removed: true, HomeRemoved: true, Home: home}); dres != want {
		t.Errorf("Deprovision = %+v, want %+v", dres, want)
	}
	if want := []string{"pkill -KILL -u alice", "userdel --remove alice"}; !reflect.DeepEqual(e.host.calls, want) {
		t.Errorf("calls = %q, want %q", e.host.calls, want)
	}
	for _, p := range []string{"validate", "kill_processes", "delete_user", "sudoers", "verify"} {
		if _, ok := dtimings[p+"_ms"]; !ok {
			t.Errorf("timings lack %s_ms: %v", p, dtimings)
		}
	}
	st, err := e.m.loadState()
	if err != nil || len(st.Users) != 0 {
		t.Errorf("state after deprovision = %+v, %v", st, err)
	}
	// Again: already absent, and the user may now go to another allocation.
	dres, _, err = e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "alloc-1", Username: "alice"}, nil)
	if err != nil || !dres.AlreadyAbsent || dres.Removed {
		t.Errorf("second Deprovision = %+v, %v", dres, err)
	}
	if _, _, err := e.m.Provision(ctx, ProvisionRequest{AllocationID: "alloc-2", Username: "alice"}, nil); err != nil {
		t.Errorf("Provision for alloc-2 after deprovision: %v", err)
	}
}

func TestProvisionRejects(t *testing.T) {
	tooMany := make([]string, MaxKeys+1)
	for i := range tooMany {
		tooMany[i] = keyA
	}
	tests := []struct {
		name  string
		setup func(e *fakeEnv)
		req   ProvisionRequest
		code  string
	}{
		{"root", nil, ProvisionRequest{AllocationID: "a", Username: "root"}, CodeInvalidParams},
		{"bad username", nil, ProvisionRequest{AllocationID: "a", Username: "Alice;rm"}, CodeInvalidParams},
		{"no allocation", nil, ProvisionRequest{Username: "alice"}, CodeInvalidParams},
		{"bad key", nil, ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAnope"}}, CodeInvalidParams},
		{"two lines in a key", nil, ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: []string{keyA + "\n" + keyB}}, CodeInvalidParams},
		{"too many keys", nil, ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: tooMany}, CodeInvalidParams},
		{"shell not listed", nil, ProvisionRequest{AllocationID: "a", Username: "alice", Shell: "/usr/bin/python3"}, CodeInvalidParams},
		{"listed shell missing", nil, ProvisionRequest{AllocationID: "a", Username: "alice", Shell: "/usr/bin/bash-nope"}, CodeInvalidParams},
		{"unmanaged system user", nil, ProvisionRequest{AllocationID: "a", Username: "daemon"}, CodeUserExistsUnmanaged},
		{"useradd fails", func(e *fakeEnv) { e.host.fail["useradd"] = exitErr(1) },
			ProvisionRequest{AllocationID: "a", Username: "alice"}, CodeUseraddFailed},
		{"visudo rejects", func(e *fakeEnv) { e.host.fail["visudo"] = exitErr(1) },
			ProvisionRequest{AllocationID: "a", Username: "alice", Sudo: true}, CodeSudoersInvalid},
		{"no sudoers dir", func(e *fakeEnv) { _ = os.Remove(e.sudoers) },
			ProvisionRequest{AllocationID: "a", Username: "alice", Sudo: true}, CodeSudoersInvalid},
		{"pending record, foreign user", func(e *fakeEnv) {
			e.host.users["alice"] = &user.User{Uid: "1500", Gid: "1500", Username: "alice", Name: "Alice", HomeDir: "/home/alice"}
			writeState(t, e, map[string]record{"alice": {AllocationID: "a", Pending: true}})
		}, ProvisionRequest{AllocationID: "a", Username: "alice"}, CodeUserExistsUnmanaged},
		{"recorded uid differs", func(e *fakeEnv) {
			e.host.users["alice"] = &user.User{Uid: "1500", Gid: "1500", Username: "alice", Name: comment("a"), HomeDir: "/home/alice"}
			writeState(t, e, map[string]record{"alice": {AllocationID: "a", UID: "1499"}})
		}, ProvisionRequest{AllocationID: "a", Username: "alice"}, CodeUserExistsUnmanaged},
		{"authorized_keys is a symlink", func(e *fakeEnv) {
			home := filepath.Join(e.host.base, "home", "alice")
			if err := os.MkdirAll(filepath.Join(home, ".ssh"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(e.shells, filepath.Join(home, ".ssh/authorized_keys")); err != nil {
				t.Fatal(err)
			}
			e.host.users["alice"] = &user.User{Uid: strconv.Itoa(os.Getuid()), Gid: strconv.Itoa(os.Getgid()), Username: "alice", Name: comment("a"), HomeDir: home}
			writeState(t, e, map[string]record{"alice": {AllocationID: "a", Pending: true}})
		}, ProvisionRequest{AllocationID: "a", Username: "alice", SSHAuthorizedKeys: []string{keyA}}, CodeAuthorizedKeysFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			before, _ := os.ReadFile(e.shells)
			_, _, err := e.m.Provision(context.Background(), tc.req, nil)
			wantCode(t, err, tc.code)
			if after, _ := os.ReadFile(e.shells); string(after) != string(before) {
				t.Error("a write went through a symlink")
			}
			if _, err := os.Stat(filepath.Join(e.sudoers, "drover-"+tc.req.Username)); err == nil {
				t.Error("sudoers drop-in left behind")
			}
			if tc.code == CodeUseraddFailed {
				if st, _ := e.m.loadState(); len(st.Users) != 0 {
					t.Errorf("pending record left after useradd failed: %+v", st.Users)
				}
			}
		})
	}
}

// TestProvisionAdoptsPendingUser: a crash between useradd and the state
// update leaves a pending record; the retry recognises the user by its
// comment and finishes.
func TestProvisionAdoptsPendingUser(t *testing.T) {
	e := newFakeEnv(t)
	home := filepath.Join(e.host.base, "home", "alice")
	if err := os.MkdirAll(home, 0o750); err != nil {
		t.Fatal(err)
	}
	e.host.users["alice"] = &user.User{Uid: strconv.Itoa(os.Getuid()), Gid: strconv.Itoa(os.Getgid()), Username: "alice", Name: comment("a:1"), HomeDir: home}
	writeState(t, e, map[string]record{"alice": {AllocationID: "a:1", Pending: true}})
	res, _, err := e.m.Provision(context.Background(), ProvisionRequest{AllocationID: "a:1", Username: "alice", SSHAuthorizedKeys: []string{keyA}}, nil)
	if err != nil || res.Created || !res.Verified.AuthorizedKeys {
		t.Fatalf("Provision = %+v, %v", res, err)
	}
	st, _ := e.m.loadState()
	if r := st.Users["alice"]; r.Pending || r.UID != strconv.Itoa(os.Getuid()) || r.AllocationID != "a:1" {
		t.Errorf("record = %+v", r)
	}
}

func TestDeprovisionRejectsAndAbsent(t *testing.T) {
	e := newFakeEnv(t)
	ctx := context.Background()
	_, _, err := e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "a", Username: "daemon", RemoveHome: true}, nil)
	wantCode(t, err, CodeUserExistsUnmanaged)
	if _, ok := e.host.users["daemon"]; !ok || contains(e.host.calls, "userdel") || contains(e.host.calls, "pkill") {
		t.Errorf("unmanaged user touched: %q", e.host.calls)
	}
	_, _, err = e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "a", Username: "root"}, nil)
	wantCode(t, err, CodeInvalidParams)
	res, _, err := e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "a", Username: "nobody-here"}, nil)
	if err != nil || !res.AlreadyAbsent || res.Removed {
		t.Errorf("unknown user: %+v, %v", res, err)
	}
	// userdel fails and the user stays: userdel_failed, record kept.
	if _, _, err := e.m.Provision(ctx, ProvisionRequest{AllocationID: "a", Username: "alice"}, nil); err != nil {
		t.Fatal(err)
	}
	e.host.fail["userdel"] = exitErr(8)
	_, _, err = e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "a", Username: "alice"}, nil)
	wantCode(t, err, CodeUserdelFailed)
	if n := strings.Count(strings.Join(e.host.calls, "\n"), "userdel alice"); n != userdelAttempts {
		t.Errorf("userdel ran %d times, want %d", n, userdelAttempts)
	}
	if st, _ := e.m.loadState(); st.Users["alice"].AllocationID != "a" {
		t.Errorf("record dropped after a failed userdel: %+v", st.Users)
	}
	// userdel removes the user but not the home: the user is forgotten
	// and the leftover home is reported.
	e.host.fail["userdel"] = nil
	e.host.keepHome = true
	res, _, err = e.m.Deprovision(ctx, DeprovisionRequest{AllocationID: "a", Username: "alice", RemoveHome: true}, nil)
	wantCode(t, err, CodeUserdelFailed)
	if !res.Removed || res.HomeRemoved {
		t.Errorf("Deprovision = %+v", res)
	}
	if st, _ := e.m.loadState(); len(st.Users) != 0 {
		t.Errorf("record kept for a deleted user: %+v", st.Users)
	}
}

func TestMergeKeys(t *testing.T) {
	block := func(id string, keys ...string) string {
		return keysBegin + " (allocation " + id + "; replaced on every provision)\n" + strings.Join(keys, "\n") + "\n" + keysEnd + "\n"
	}
	tests := []struct {
		name, old string
		keys      []string
		want      string
	}{
		{"empty", "", []string{keyA}, block("a", keyA)},
		{"no keys, no file", "", nil, ""},
		{"keeps others", "# mine\n" + keyB + "\n", []string{keyA}, "# mine\n" + keyB + "\n" + block("a", keyA)},
		{"replaces block", "x\n" + block("old", keyB) + "y\n", []string{keyA}, "x\ny\n" + block("a", keyA)},
		{"removes block", block("old", keyB), nil, ""},
		{"unterminated block", "x\n" + keysBegin + "\n" + keyB + "\n", []string{keyA}, "x\n" + block("a", keyA)},
		{"trims key", "", []string{"  " + keyA + " "}, block("a", keyA)},
	}
	for _, tc := range tests {
		if got := string(mergeKeys([]byte(tc.old), "a", tc.keys)); got != tc.want {
			t.Errorf("%s: mergeKeys =\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}

func writeState(t *testing.T, e *fakeEnv, users map[string]record) {
	t.Helper()
	if err := e.m.saveState(state{Version: stateVersion, Users: users}); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if CodeOf(err) != code {
		t.Errorf("err = %v, want code %s", err, code)
	}
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Error(err)
		return
	}
	if fi.Mode() != want {
		t.Errorf("%s: mode %s, want %s", path, fi.Mode(), want)
	}
}

func contains(calls []string, prefix string) bool {
	for _, c := range calls {
		if strings.HasPrefix(c, prefix) {
			return true
		}
	}
	return false
}
