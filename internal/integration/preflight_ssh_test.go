package integration

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/drover-dev/drover/internal/cli/preflight"
	wirepf "github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// startPreflightSSHD is a throwaway sshd (as the ssh benchmark baseline
// runs it) that the current user, root included, may log in to with the
// client key.
func startPreflightSSHD(t *testing.T) *testSSHD {
	t.Helper()
	requireRoot(t)
	return startTestSSHD(t, sshdOptions{name: "drover-preflight", who: "the SSH preflight test",
		debian: "openssh-server, openssh-client, util-linux", permitRootLogin: "prohibit-password"})
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
