package integration

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The ssh baseline of the terminal benchmarks: a throwaway sshd
// (startTestSSHD) that a throwaway user logs in to.

// skipWithout skips (fails under CI=true) unless every program exists.
func skipWithout(b *testing.B, progs ...string) {
	b.Helper()
	requirePrograms(b, "this benchmark", benchDebian, progs...)
}

// benchDebian are the Debian packages the benchmarks' programs come from.
const benchDebian = "openssh-server, openssh-client, passwd, util-linux"

// startSSHD starts sshd for the benchmark and stops it at cleanup; the
// client's key is authorized for login (a throwaway user's), in its home.
func startSSHD(b *testing.B, login string) *testSSHD {
	b.Helper()
	needRoot(b, "the ssh baseline")
	return startTestSSHD(b, sshdOptions{name: "drover-bench", who: "this benchmark", debian: benchDebian,
		progs: []string{"ssh"}, permitRootLogin: "no",
		authorize: func(tb testing.TB, pub []byte) { authorize(tb, login, pub) }})
}

// authorize writes login's ~/.ssh/authorized_keys, owned by login.
func authorize(b testing.TB, login string, pub []byte) {
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
	c := exec.Command("ssh", "-tt", "-F", "/dev/null", "-e", "none", "-i", d.key, "-p", strconv.Itoa(d.port),
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
