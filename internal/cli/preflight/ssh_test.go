package preflight

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	sshagent "golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// sshNode is an in-process SSH server on loopback that runs exec requests
// with /bin/sh, accepting one client key.
type sshNode struct {
	addr      string
	hostKey   ssh.PublicKey
	clientKey string // private key file
}

func startSSHNode(t *testing.T) *sshNode {
	t.Helper()
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	_, clientPriv, _ := ed25519.GenerateKey(rand.Reader)
	clientSigner, _ := ssh.NewSignerFromKey(clientPriv)
	block, err := ssh.MarshalPrivateKey(clientPriv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	want := clientSigner.PublicKey().Marshal()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(k.Marshal(), want) {
			return nil, nil
		}
		return nil, os.ErrPermission
	}}
	cfg.AddHostKey(hostSigner)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveSSH(c, cfg)
		}
	}()
	return &sshNode{addr: ln.Addr().String(), hostKey: hostSigner.PublicKey(), clientKey: keyFile}
}

func serveSSH(c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "sessions only")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go func() {
			defer ch.Close()
			for req := range chReqs {
				if req.Type != "exec" || len(req.Payload) < 4 {
					_ = req.Reply(false, nil)
					continue
				}
				_ = req.Reply(true, nil)
				cmd := exec.Command("/bin/sh", "-c", string(req.Payload[4:]))
				cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
				code := 0
				if err := cmd.Run(); err != nil {
					code = 255
					if ee, ok := err.(*exec.ExitError); ok {
						code = ee.ExitCode()
					}
				}
				var st [4]byte
				binary.BigEndian.PutUint32(st[:], uint32(code))
				_, _ = ch.SendRequest("exit-status", false, st[:])
				return
			}
		}()
	}
}

// knownHosts writes a known_hosts file naming key for addr.
func knownHosts(t *testing.T, addr string, key ssh.PublicKey) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(p, []byte(knownhosts.Line([]string{knownhosts.Normalize(addr)}, key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func sshConfig(n *sshNode, known, agent string) func(*Config) {
	host, port, _ := net.SplitHostPort(n.addr)
	return func(c *Config) {
		c.NodeHost, c.NodeUser, c.SSHKey, c.SSHKnownHosts, c.AgentBinary = host, "ops", n.clientKey, known, agent
		c.SSHPort, _ = strconv.Atoi(port)
	}
}

func TestSSHNodeSide(t *testing.T) {
	n := startSSHNode(t)
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := ssh.NewSignerFromKey(otherPriv)
	agent := fakeAgent(t, nodeHops(signal.HopNodeRuntimeAPIReachability, signal.APIUnreachable)...)

	t.Run("good key runs the node-side hops", func(t *testing.T) {
		rep, _, _ := runFake(t, newFake(t), sshConfig(n, knownHosts(t, n.addr, n.hostKey), agent))
		if r := hopOf(rep, signal.HopNodeOpsAccess); r.Status != preflight.Passed {
			t.Fatalf("node_ops_access %+v", r)
		}
		if r := hopOf(rep, signal.HopNodeReadiness); r.Status != preflight.Passed {
			t.Errorf("node_readiness %+v", r)
		}
		if c := rep.Classification; c.Hop != signal.HopNodeRuntimeAPIReachability || c.Signal != signal.APIUnreachable {
			t.Errorf("classification %+v", c)
		}
	})
	t.Run("known_hosts mismatch", func(t *testing.T) {
		rep, _, _ := runFake(t, newFake(t), sshConfig(n, knownHosts(t, n.addr, other.PublicKey()), agent))
		r := hopOf(rep, signal.HopNodeOpsAccess)
		if r.Status != preflight.Failed || r.Signal != signal.OpsSSHFailed || !strings.Contains(r.Detail, "knownhosts") {
			t.Fatalf("node_ops_access %+v", r)
		}
		if rep.Classification.Hop != signal.HopNodeOpsAccess {
			t.Errorf("classification %+v", rep.Classification)
		}
	})
	t.Run("key from the SSH agent", func(t *testing.T) {
		pemBytes, err := os.ReadFile(n.clientKey)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := ssh.ParseRawPrivateKey(pemBytes)
		if err != nil {
			t.Fatal(err)
		}
		keyring := sshagent.NewKeyring()
		if err := keyring.Add(sshagent.AddedKey{PrivateKey: raw}); err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(t.TempDir(), "agent.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); _ = sshagent.ServeAgent(keyring, c) }()
			}
		}()
		t.Setenv("SSH_AUTH_SOCK", sock)
		cfg := sshConfig(n, knownHosts(t, n.addr, n.hostKey), agent)
		rep, _, _ := runFake(t, newFake(t), func(c *Config) { cfg(c); c.SSHKey = "" })
		if r := hopOf(rep, signal.HopNodeOpsAccess); r.Status != preflight.Passed {
			t.Fatalf("node_ops_access %+v", r)
		}
	})
	t.Run("host key unknown", func(t *testing.T) {
		empty := filepath.Join(t.TempDir(), "known_hosts")
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		rep, _, _ := runFake(t, newFake(t), sshConfig(n, empty, agent))
		if r := hopOf(rep, signal.HopNodeOpsAccess); r.Signal != signal.OpsSSHFailed || !strings.Contains(r.Detail, "is not in "+empty) {
			t.Fatalf("node_ops_access %+v", r)
		}
	})
	t.Run("wrong key", func(t *testing.T) {
		cfg := sshConfig(n, knownHosts(t, n.addr, n.hostKey), agent)
		other := startSSHNode(t).clientKey
		rep, _, _ := runFake(t, newFake(t), func(c *Config) { cfg(c); c.SSHKey = other })
		if r := hopOf(rep, signal.HopNodeOpsAccess); r.Signal != signal.OpsSSHFailed || !strings.Contains(r.Detail, "unable to authenticate") {
			t.Fatalf("node_ops_access %+v", r)
		}
	})
	t.Run("connection reset in the handshake", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.(*net.TCPConn).SetLinger(0)
				buf := make([]byte, 64)
				_, _ = c.Read(buf) // the client's banner, then a reset
				c.Close()
			}
		}()
		reset := &sshNode{addr: ln.Addr().String(), clientKey: n.clientKey}
		rep, _, _ := runFake(t, newFake(t), sshConfig(reset, knownHosts(t, reset.addr, n.hostKey), agent))
		if r := hopOf(rep, signal.HopNodeOpsAccess); r.Signal != signal.OpsAccessUnhealthy {
			t.Fatalf("node_ops_access %+v", r)
		}
	})
	t.Run("missing agent binary", func(t *testing.T) {
		rep, _, _ := runFake(t, newFake(t), sshConfig(n, knownHosts(t, n.addr, n.hostKey), "/nonexistent/drover-agent"))
		if r := hopOf(rep, signal.HopNodeOpsAccess); r.Status != preflight.Passed {
			t.Fatalf("node_ops_access %+v", r)
		}
		if r := hopOf(rep, signal.HopNodeReadiness); r.Signal != signal.BinaryInvalid || !strings.Contains(r.Detail, "exited 127") {
			t.Fatalf("node_readiness %+v", r)
		}
	})
}
