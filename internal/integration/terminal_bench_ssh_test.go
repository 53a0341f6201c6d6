package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The ssh baseline of the terminal benchmarks: Debian's openssh-server
// started for the run on a loopback port with its own config, host key and
// authorized key in a temp dir. /etc/ssh and any system sshd are left
// alone: sshd runs in a private mount namespace whose /run is a fresh
// tmpfs, so its privilege separation directory /run/sshd exists there only.

// benchSSHD is a running throwaway sshd.
type benchSSHD struct {
	port string
	key  string // the client's private key
}

// skipWithout skips (fails under CI=true) unless every program exists.
func skipWithout(b *testing.B, progs ...string) {
	b.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			msg := fmt.Sprintf("this benchmark needs %s (Debian: openssh-server, openssh-client, passwd, util-linux): %v", p, err)
			if os.Getenv("CI") == "true" {
				b.Fatal(msg)
			}
			b.Skip(msg)
		}
	}
}

// startSSHD starts sshd for the benchmark and stops it at cleanup; the
// client's key is authorized for login (a throwaway user's), in its home.
func startSSHD(b *testing.B, login string) *benchSSHD {
	b.Helper()
	needRoot(b, "the ssh baseline")
	skipWithout(b, "/usr/sbin/sshd", "ssh", "ssh-keygen", "unshare")
	dir := b.TempDir()
	for _, k := range []string{"host_key", "client_key"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "drover-bench",
			"-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			b.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(dir, "client_key.pub"))
	if err != nil {
		b.Fatal(err)
	}
	authorize(b, login, pub)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	cfg := filepath.Join(dir, "sshd_config")
	conf := fmt.Sprintf(`ListenAddress 127.0.0.1:%s
HostKey %s
PermitRootLogin no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
PidFile none
LogLevel ERROR
`, port, filepath.Join(dir, "host_key"))
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
		`mount -t tmpfs -o mode=0755 drover-bench /run && mkdir -m 0755 /run/sshd && exec /usr/sbin/sshd -D -e -f "$1"`,
		"sh", cfg)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start sshd: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	b.Cleanup(func() {
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
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			b.Fatalf("sshd exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("sshd not listening on %s after 10s: %v; %s", port, err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &benchSSHD{port: port, key: filepath.Join(dir, "client_key")}
}

// authorize writes login's ~/.ssh/authorized_keys, owned by login.
func authorize(b *testing.B, login string, pub []byte) {
	b.Helper()
	u, err := user.Lookup(login)
	if err != nil {
		b.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	dir := filepath.Join(u.HomeDir, ".ssh")
	file := filepath.Join(dir, "authorized_keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(file, pub, 0o600); err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{dir, file} {
		if err := os.Chown(p, uid, gid); err != nil {
			b.Fatal(err)
		}
	}
}

// cmdStream is a process's stdout and stdin.
type cmdStream struct {
	io.Reader
	io.WriteCloser
}

// openSSH runs cmd through `ssh -tt` (a remote PTY) to a fresh sshd as a
// throwaway user.
func openSSH(b *testing.B, cmd string) io.ReadWriter {
	login := benchUser(b)
	d := startSSHD(b, login)
	c := exec.Command("ssh", "-tt", "-F", "/dev/null", "-e", "none", "-i", d.key, "-p", d.port,
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
		"-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", login+"@127.0.0.1", cmd)
	in, err := c.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		b.Fatalf("start ssh: %v", err)
	}
	b.Cleanup(func() {
		in.Close()
		_ = c.Process.Kill()
		if err := c.Wait(); err != nil && !isKilled(err) {
			b.Logf("ssh: %v: %s", err, stderr.String())
		}
	})
	awaitMarker(b, out, func() { _ = c.Process.Kill() }, 15*time.Second)
	return cmdStream{out, in}
}

func isKilled(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}
