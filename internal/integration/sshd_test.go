package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// testSSHD is Debian's openssh-server started for one test or benchmark on
// a loopback port with its own config, host key and client key in a temp
// dir. /etc/ssh and any system sshd are left alone: sshd runs in a private
// mount namespace whose /run is a fresh tmpfs, so its privilege separation
// directory /run/sshd exists there only.
type testSSHD struct {
	port    int
	key     string // the client's private key file
	hostKey ssh.PublicKey
}

// sshdOptions are what the callers of startTestSSHD differ in.
type sshdOptions struct {
	// name is the keys' comment and the tmpfs's source name.
	name string
	// who and debian complete the skip message for a missing program:
	// "<who> needs <program> (Debian: <debian>)".
	who, debian string
	// progs are programs needed besides sshd, ssh-keygen and unshare.
	progs []string
	// permitRootLogin is sshd's PermitRootLogin.
	permitRootLogin string
	// authorize, when set, installs the client's public key where sshd
	// looks for it by default (a user's ~/.ssh/authorized_keys); unset,
	// the key goes into authorized_keys in the temp dir, which sshd is
	// configured to read for every user.
	authorize func(tb testing.TB, pub []byte)
}

// requirePrograms skips tb (fails it under CI=true) unless every program
// exists; who is what needs them, debian the packages that have them.
func requirePrograms(tb testing.TB, who, debian string, progs ...string) {
	tb.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			msg := fmt.Sprintf("%s needs %s (Debian: %s): %v", who, p, debian, err)
			if os.Getenv("CI") == "true" {
				tb.Fatal(msg)
			}
			tb.Skip(msg)
		}
	}
}

// startTestSSHD starts sshd, waits until it listens and stops it at
// cleanup. The caller checks for root first.
func startTestSSHD(tb testing.TB, o sshdOptions) *testSSHD {
	tb.Helper()
	requirePrograms(tb, o.who, o.debian, append([]string{"/usr/sbin/sshd", "ssh-keygen", "unshare"}, o.progs...)...)
	dir := tb.TempDir()
	for _, k := range []string{"host_key", "client_key"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", o.name,
			"-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			tb.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(dir, "client_key.pub"))
	if err != nil {
		tb.Fatal(err)
	}
	authKeys := ""
	if o.authorize != nil {
		o.authorize(tb, pub)
	} else {
		authKeys = filepath.Join(dir, "authorized_keys")
		if err := os.WriteFile(authKeys, pub, 0o600); err != nil {
			tb.Fatal(err)
		}
		authKeys = "AuthorizedKeysFile " + authKeys + "\n"
	}
	hostPub, err := os.ReadFile(filepath.Join(dir, "host_key.pub"))
	if err != nil {
		tb.Fatal(err)
	}
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey(hostPub)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := filepath.Join(dir, "sshd_config")
	conf := fmt.Sprintf(`ListenAddress %s
HostKey %s
%sPermitRootLogin %s
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
PidFile none
LogLevel ERROR
`, addr, filepath.Join(dir, "host_key"), authKeys, o.permitRootLogin)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		tb.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs -o mode=0755 "$1" /run && mkdir -m 0755 /run/sshd && exec /usr/sbin/sshd -D -e -f "$2"`,
		"sh", o.name, cfg)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start sshd: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	tb.Cleanup(func() {
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
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			tb.Fatalf("sshd exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("sshd not listening on %d after 10s: %v; %s", port, err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &testSSHD{port: port, key: filepath.Join(dir, "client_key"), hostKey: hostKey}
}
