package termnode_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// guestSSHD is the host's OpenSSH sshd on a loopback port standing in for
// a guest's SSH server (the TCG guest test in internal/integration runs
// the same sshd inside a real VM): a host key, and an authorized terminal
// key for the current user.
type guestSSHD struct {
	addr     string
	hostKey  string // authorized_keys line
	termKey  string // private key path (authorized)
	otherKey string // private key path (not authorized)
}

func startGuestSSHD(t *testing.T) guestSSHD {
	t.Helper()
	for _, p := range []string{"/usr/sbin/sshd", "ssh-keygen", "unshare"} {
		if _, err := exec.LookPath(p); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found (required when CI=true)", p)
			}
			t.Skipf("%s not found", p)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd needs root for its privilege separation directory")
	}
	dir := t.TempDir()
	for _, k := range []string{"host_key", "term_key", "other_key"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", k,
			"-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), []byte(read("term_key.pub")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	conf := fmt.Sprintf(`ListenAddress %s
HostKey %s
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
PidFile none
LogLevel ERROR
`, addr, filepath.Join(dir, "host_key"), filepath.Join(dir, "authorized_keys"))
	cfg := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs -o mode=0755 guest-sshd /run && mkdir -m 0755 /run/sshd && exec /usr/sbin/sshd -D -e -f "$1"`,
		"sh", cfg)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("sshd exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd not listening on %s: %v; %s", addr, err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return guestSSHD{addr: addr, hostKey: read("host_key.pub"), termKey: filepath.Join(dir, "term_key"),
		otherKey: filepath.Join(dir, "other_key")}
}

// vmParams are the params of a vm_ssh session into vm for alloc.
func vmParams(t *testing.T, vm, alloc, username string) task.TerminalOpenParams {
	return task.TerminalOpenParams{SessionID: "ts-" + randHex(t, 6), AllocationID: alloc, Nonce: randHex(t, 32),
		Mode: task.TerminalModeVMSSH, VMName: vm, Username: username, Cols: 80, Rows: 24, MaxLifetime: api.Duration(time.Hour)}
}

// targets serves VMTarget from a table keyed by vm, owned by alloc-1.
func targets(byVM map[string]termnode.VMTarget) func(*termnode.Config) {
	return func(c *termnode.Config) {
		c.VMTarget = func(_ context.Context, vm, alloc string) (termnode.VMTarget, error) {
			t, ok := byVM[vm]
			if !ok {
				return termnode.VMTarget{}, fmt.Errorf("no vm %q", vm)
			}
			if alloc != "alloc-1" {
				return termnode.VMTarget{}, &termnode.Error{CodedError: api.CodedError{Code: termnode.CodeGuestNotOwned,
					Message: fmt.Sprintf("vm %q belongs to alloc-1, not %q", vm, alloc)}}
			}
			return t, nil
		}
	}
}

// TestVMSSHSession brokers a session into a real OpenSSH server: ready
// comes first, a typed command's output comes back, a resize reaches the
// guest PTY, and exit ends the session with the shell's code.
func TestVMSSHSession(t *testing.T) {
	g0 := startGuestSSHD(t)
	user := currentUser(t)
	fx := newPKI(t)
	p := vmParams(t, "vm-a", "alloc-1", user)
	g := newGateway(t, fx, p.Nonce)
	m := newManager(t, g, clientTLS(fx.pool, fx.client), targets(map[string]termnode.VMTarget{
		"vm-a": {Addr: g0.addr, User: user, KeyPath: g0.termKey, HostKeys: []string{g0.hostKey}}}))
	var phases []string
	res, err := m.Open(context.Background(), p, "cid", func(phase string, _ time.Duration, err error) {
		if err != nil {
			t.Errorf("phase %s: %v", phase, err)
		}
		phases = append(phases, phase)
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if strings.Join(phases, ",") != "stream_connect,pty_start" || res.Mode != task.TerminalModeVMSSH {
		t.Errorf("phases %v, result %+v", phases, res)
	}
	s := g.waitStream()
	if c := untilControl(s, 10*time.Second); c.Type != terminal.TypeReady {
		t.Fatalf("first control = %+v, want ready", c)
	}
	s.Send(terminal.ChanResize, terminal.EncodeResize(terminal.Size{Cols: 101, Rows: 33}))
	s.Send(terminal.ChanStdin, []byte("stty size; echo vm-$((6*7))-ok; tty\n"))
	readUntilRE(t, s, regexp.MustCompile(`33 101[\s\S]*vm-42-ok[\s\S]*/dev/pts/`), 30*time.Second)
	s.Send(terminal.ChanStdin, []byte("exit 7\n"))
	c := untilControl(s, 30*time.Second)
	if c.Type != terminal.TypeExit || c.ExitCode != 7 {
		t.Fatalf("control = %+v, want exit 7", c)
	}
	waitActive(t, m, 0)
}

// TestVMSSHRefusals: each failure names its hop, arrives as a structured
// error (task code, and an error frame on the stream whose message starts
// with it), and never hangs. A wrong host key stops before authentication,
// so no PTY is ever asked for.
func TestVMSSHRefusals(t *testing.T) {
	g0 := startGuestSSHD(t)
	user := currentUser(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := closed.Addr().String()
	_ = closed.Close()
	otherHost := startGuestSSHD(t).hostKey
	byVM := map[string]termnode.VMTarget{
		"vm-ok":       {Addr: g0.addr, User: user, KeyPath: g0.termKey, HostKeys: []string{g0.hostKey}},
		"vm-hostkey":  {Addr: g0.addr, User: user, KeyPath: g0.termKey, HostKeys: []string{otherHost}},
		"vm-nopin":    {Addr: g0.addr, User: user, KeyPath: g0.termKey},
		"vm-auth":     {Addr: g0.addr, User: user, KeyPath: g0.otherKey, HostKeys: []string{g0.hostKey}},
		"vm-dead":     {Addr: deadAddr, User: user, KeyPath: g0.termKey, HostKeys: []string{g0.hostKey}},
		"vm-remote":   {Addr: "192.0.2.1:22", User: user, KeyPath: g0.termKey, HostKeys: []string{g0.hostKey}},
		"vm-otheruse": {Addr: g0.addr, User: "someone-else", KeyPath: g0.termKey, HostKeys: []string{g0.hostKey}},
	}
	for _, tc := range []struct {
		name, vm, alloc, code string
	}{
		{"host key mismatch", "vm-hostkey", "alloc-1", termnode.CodeGuestHostKeyMismatch},
		{"no pinned host key", "vm-nopin", "alloc-1", termnode.CodeGuestTerminalUnavailable},
		{"key not authorized", "vm-auth", "alloc-1", termnode.CodeGuestAuthFailed},
		{"unreachable", "vm-dead", "alloc-1", termnode.CodeGuestSSHUnreachable},
		{"not on loopback", "vm-remote", "alloc-1", termnode.CodeGuestTerminalUnavailable},
		{"unknown vm", "vm-none", "alloc-1", termnode.CodeGuestTerminalUnavailable},
		{"another allocation's vm", "vm-ok", "alloc-2", termnode.CodeGuestNotOwned},
		{"another user", "vm-otheruse", "alloc-1", termnode.CodeGuestNotOwned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newPKI(t)
			p := vmParams(t, tc.vm, tc.alloc, user)
			g := newGateway(t, fx, p.Nonce)
			m := newManager(t, g, clientTLS(fx.pool, fx.client), targets(byVM))
			ctx, cancel := context.WithTimeout(context.Background(), task.TerminalOpenTimeout)
			defer cancel()
			start := time.Now()
			_, err := m.Open(ctx, p, "cid", nil)
			if err == nil {
				t.Fatal("Open succeeded")
			}
			if got := codeOf(t, err); got != tc.code {
				t.Fatalf("code = %s (%v), want %s", got, err, tc.code)
			}
			if d := time.Since(start); d > task.TerminalOpenTimeout {
				t.Errorf("took %s", d)
			}
			s := g.waitStream()
			c := untilControl(s, 10*time.Second)
			if c.Type != terminal.TypeError || c.Error != terminal.CodePTYFailed || !strings.HasPrefix(c.Message, tc.code+": ") {
				t.Errorf("control = %+v, want error %s with message %q...", c, terminal.CodePTYFailed, tc.code)
			}
			waitActive(t, m, 0)
		})
	}
}

// TestVMSSHUnsupported: an agent without VM targets refuses vm_ssh.
func TestVMSSHUnsupported(t *testing.T) {
	fx := newPKI(t)
	p := vmParams(t, "vm-a", "alloc-1", "root")
	g := newGateway(t, fx, p.Nonce)
	m := newManager(t, g, clientTLS(fx.pool, fx.client))
	_, err := m.Open(context.Background(), p, "cid", nil)
	if got := codeOf(t, err); got != termnode.CodeGuestTerminalUnavailable {
		t.Fatalf("code = %s, want %s", got, termnode.CodeGuestTerminalUnavailable)
	}
}

// TestVMSSHSilentGuest: a guest whose forward accepts but never speaks SSH
// (sshd not up yet behind QEMU's forward) fails with guest_ssh_unreachable
// when terminal.open's deadline passes, never hangs.
func TestVMSSHSilentGuest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	fx := newPKI(t)
	p := vmParams(t, "vm-a", "alloc-1", "root")
	g := newGateway(t, fx, p.Nonce)
	m := newManager(t, g, clientTLS(fx.pool, fx.client), targets(map[string]termnode.VMTarget{
		"vm-a": {Addr: ln.Addr().String(), User: "root", KeyPath: "/nonexistent", HostKeys: []string{"x"}}}))
	_, err = m.Open(context.Background(), p, "cid", nil)
	if got := codeOf(t, err); got != termnode.CodeGuestTerminalUnavailable {
		t.Fatalf("code = %s (%v), want %s (no key file)", got, err, termnode.CodeGuestTerminalUnavailable)
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "k")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	p = vmParams(t, "vm-a", "alloc-1", "root")
	g = newGateway(t, fx, p.Nonce)
	m = newManager(t, g, clientTLS(fx.pool, fx.client), targets(map[string]termnode.VMTarget{
		"vm-a": {Addr: ln.Addr().String(), User: "root", KeyPath: key, HostKeys: []string{string(pub)}}}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err = m.Open(ctx, p, "cid", nil)
	if got := codeOf(t, err); got != termnode.CodeGuestSSHUnreachable {
		t.Fatalf("code = %s (%v), want %s", got, err, termnode.CodeGuestSSHUnreachable)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Open took %s with a 3s deadline", d)
	}
}
