package qemutest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/node/cloudinit"
)

// TestGuestSSHD boots the guest built with Options.SSHD and a NoCloud seed:
// it prints its host key in cloud-init's block on ttyS0, its sshd presents
// exactly that key on port 22 and lets the seed's user in with the seed's
// key, with a PTY.
func TestGuestSSHD(t *testing.T) {
	g := BuildWith(t, "", Options{SSHD: true})
	if !g.CanSSHD || !strings.Contains(g.Cmdline, KnobSSHD) {
		t.Fatalf("guest %+v", g)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(t.TempDir(), "seed.iso")
	f, err := os.Create(seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := cloudinit.WriteISO(context.Background(), cloudinit.Config{InstanceID: "sshd-test", User: "alice",
		SSHAuthorizedKeys: []string{strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))}}, f, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	port := freePort(t)
	login := func(serialPath string) {
		b, _ := os.ReadFile(serialPath)
		begin, end := bytes.Index(b, []byte(HostKeysBegin)), bytes.Index(b, []byte(HostKeysEnd))
		if begin < 0 || end < begin {
			t.Fatalf("no host key block before the marker; serial: %s", b)
		}
		pinned, _, _, _, err := ssh.ParseAuthorizedKey(bytes.TrimSpace(b[begin+len(HostKeysBegin) : end]))
		if err != nil {
			t.Fatalf("host key block: %v; serial: %s", err, b)
		}
		cfg := &ssh.ClientConfig{User: "alice", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
			HostKeyCallback: ssh.FixedHostKey(pinned), Timeout: 30 * time.Second}
		var c *ssh.Client
		deadline := time.Now().Add(60 * time.Second)
		for {
			if c, err = ssh.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), cfg); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(serialPath)
				t.Fatalf("ssh alice@guest: %v; serial: %s", err, b)
			}
			time.Sleep(200 * time.Millisecond)
		}
		defer c.Close()
		s, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		out, err := s.CombinedOutput("id -un; tty")
		if err != nil || !strings.HasPrefix(string(out), "alice\r\n/dev/pts/") {
			t.Fatalf("id -un; tty = %q, %v", out, err)
		}
	}
	r := boot(t, g, "", []string{"-netdev", fmt.Sprintf("user,id=n0,hostfwd=tcp:127.0.0.1:%d-:22", port),
		"-device", "virtio-net-pci,netdev=n0",
		"-drive", "if=none,id=seed0,file=" + seed + ",format=raw,media=cdrom,readonly=on",
		"-device", "virtio-scsi-pci,id=scsi0", "-device", "scsi-cd,bus=scsi0.0,drive=seed0"},
		login, "system_powerdown", 30*time.Second)
	if r.exitedIn < 0 {
		t.Errorf("the guest did not power off with sshd running; serial: %s", r.serial)
	}
}
