package integration

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/drover-dev/drover/internal/cli/preflight"
	wirepf "github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// preflightSSHD is Debian's sshd on a loopback port with its own config,
// host key and authorized key in a temp dir, in a private mount namespace
// (as the ssh benchmark baseline runs it); the current user may log in
// with key.
type preflightSSHD struct {
	port    int
	key     string // the client's private key file
	hostKey ssh.PublicKey
}

func startPreflightSSHD(t *testing.T) *preflightSSHD {
	t.Helper()
	requireRoot(t)
	for _, p := range []string{"/usr/sbin/sshd", "ssh-keygen", "unshare"} {
		if _, err := exec.LookPath(p); err != nil {
			msg := fmt.Sprintf("the SSH preflight test needs %s (Debian: openssh-server, openssh-client, util-linux): %v", p, err)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	dir := t.TempDir()
	for _, k := range []string{"host_key", "client_key"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "drover-preflight",
			"-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(dir, "client_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	hostPub, err := os.ReadFile(filepath.Join(dir, "host_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey(hostPub)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := filepath.Join(dir, "sshd_config")
	conf := fmt.Sprintf(`ListenAddress 127.0.0.1:%d
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
`, port, filepath.Join(dir, "host_key"), filepath.Join(dir, "authorized_keys"))
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs -o mode=0755 drover-preflight /run && mkdir -m 0755 /run/sshd && exec /usr/sbin/sshd -D -e -f "$1"`,
		"sh", cfg)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sshd: %v", err)
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("sshd exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd not listening on %d after 10s: %v; %s", port, err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &preflightSSHD{port: port, key: filepath.Join(dir, "client_key"), hostKey: hostKey}
}

// knownHostsFile writes a known_hosts naming key for 127.0.0.1:port.
func knownHostsFile(t *testing.T, port int, key ssh.PublicKey) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "known_hosts")
	line := knownhosts.Line([]string{knownhosts.Normalize("127.0.0.1:" + strconv.Itoa(port))}, key)
	if err := os.WriteFile(p, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// agentWrapper is a script that runs bin with the agent's configuration in
// its environment, as the node's own service environment would.
func agentWrapper(t *testing.T, bin string, env map[string]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	for k, v := range env {
		fmt.Fprintf(&b, "export %s='%s'\n", k, v)
	}
	fmt.Fprintf(&b, "exec '%s' \"$@\"\n", bin)
	p := filepath.Join(t.TempDir(), "drover-agent")
	if err := os.WriteFile(p, []byte(b.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPreflightSSH runs the node-side hops over a real sshd: with the
// node's host key in known_hosts every hop passes; with another key there
// node_ops_access fails with node_ops_ssh_failed while the host is healthy.
func TestPreflightSSH(t *testing.T) {
	sshd := startPreflightSSHD(t)
	bin := buildAgent(t)
	e := startEnv(t, openSQLite(t))
	n := e.preflightNode("pf-ssh")
	wrapper := agentWrapper(t, bin, e.agentEnv(n))
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(known string) preflight.Config {
		return preflight.Config{NodeID: n.id, NodeHost: "127.0.0.1", NodeUser: me.Username, SSHPort: sshd.port,
			SSHKey: sshd.key, SSHKnownHosts: known, AgentBinary: wrapper}
	}

	rep := e.runPreflight(cfg(knownHostsFile(t, sshd.port, sshd.hostKey)))
	if !rep.Classification.OK {
		t.Fatalf("good key: %+v\n%s", rep.Classification, hopTable(rep))
	}
	for _, h := range []signal.Hop{signal.HopNodeOpsAccess, signal.HopNodeReadiness, signal.HopNodeRuntimeAPIReachability,
		signal.HopNodeTerminalReachability} {
		if r := pfHop(rep, h); r.Status != wirepf.Passed {
			t.Errorf("hop %s: %s (%s)", h, r.Status, r.Detail)
		}
	}

	_, other, _ := ed25519.GenerateKey(rand.Reader)
	otherSigner, _ := ssh.NewSignerFromKey(other)
	rep = e.runPreflight(cfg(knownHostsFile(t, sshd.port, otherSigner.PublicKey())))
	wantFailedAt(t, rep, signal.HopNodeOpsAccess, signal.OpsSSHFailed)
	if r := pfHop(rep, signal.HopNodeHeartbeat); r.Status != wirepf.Passed {
		t.Errorf("node_heartbeat %+v: the host is healthy", r)
	}
	if d := pfHop(rep, signal.HopNodeOpsAccess).Detail; !strings.Contains(d, "knownhosts: key mismatch") {
		t.Errorf("detail %q", d)
	}
}
