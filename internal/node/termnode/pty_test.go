//go:build linux

package termnode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

func currentUser(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// shPasswd writes a passwd file giving username the login shell /bin/sh:
// the tests must not depend on how heavy the real user's profile is.
func shPasswd(t *testing.T, username string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(path, []byte(username+":x:0:0::/nonexistent:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// shManager is newManager whose login shells are /bin/sh.
func shManager(t *testing.T, g *gateway, fx *pkiFixture, username string, mod ...func(*termnode.Config)) *termnode.Manager {
	t.Helper()
	m := newManager(t, g, clientTLS(fx.pool, fx.client), mod...)
	termnode.SetPasswdFile(m, shPasswd(t, username))
	return m
}

// openPTY opens a PTY session for the current user, with /bin/sh as its
// login shell, against a fresh gateway and returns the gateway's end after
// checking that ready came first.
func openPTY(t *testing.T, opts ...func(*terminaltest.Options)) (*termnode.Manager, *stream, termnode.Result) {
	t.Helper()
	return openPTYAs(t, currentUser(t), true, opts...)
}

// openPTYAs is openPTY for username; with sh false the shell comes from the
// real /etc/passwd.
func openPTYAs(t *testing.T, username string, sh bool, opts ...func(*terminaltest.Options)) (*termnode.Manager, *stream, termnode.Result) {
	t.Helper()
	fx := newPKI(t)
	p := ptyParams(t, username)
	g := newGateway(t, fx, p.Nonce, opts...)
	m := newManager(t, g, clientTLS(fx.pool, fx.client))
	if sh {
		termnode.SetPasswdFile(m, shPasswd(t, username))
	}
	var phases []string
	res, err := m.Open(context.Background(), p, "cid-"+p.SessionID, func(phase string, _ time.Duration, err error) {
		if err != nil {
			t.Errorf("phase %s: %v", phase, err)
		}
		phases = append(phases, phase)
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if strings.Join(phases, ",") != "stream_connect,pty_start" {
		t.Errorf("phases = %v", phases)
	}
	if res.SessionID != p.SessionID || res.Mode != "pty" || res.PID <= 0 {
		t.Errorf("result = %+v", res)
	}
	s := g.waitStream()
	if got := s.Req.URL.Path; got != "/internal/v1/nodes/"+testNode+"/terminal/"+p.SessionID {
		t.Errorf("stream path = %q", got)
	}
	if got := s.Req.Header.Get(api.HeaderCorrelationID); got != "cid-"+p.SessionID {
		t.Errorf("correlation id = %q", got)
	}
	if c := s.Control(10 * time.Second); c.Type != terminal.TypeReady || c.SessionID != p.SessionID {
		t.Fatalf("first frame = %+v, want ready for %s", c, p.SessionID)
	}
	return m, s, res
}

// processGone reports whether pid no longer runs (gone or a zombie waiting
// for a reaper that is not us).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

func waitGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs after %s", pid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPTYSession(t *testing.T) {
	t.Parallel()
	m, s, res := openPTY(t)
	tag := randHex(t, 4)
	// The command line holds $((6*7)), the output 42: the echo of the
	// typed line cannot satisfy the check.
	s.Stdin("echo hello-$((6*7))-" + tag + "\n")
	s.ReadUntil("hello-42-"+tag, 10*time.Second)

	s.Send(terminal.ChanControl, mustControl(t, terminal.Ping()))
	if c := untilControl(s, 5*time.Second); c.Type != terminal.TypePong {
		t.Fatalf("control ping answered with %+v", c)
	}

	s.Send(terminal.ChanResize, terminal.EncodeResize(terminal.Size{Cols: 132, Rows: 43}))
	s.Stdin("echo size-$(stty size | tr ' ' x)-" + tag + "\n")
	s.ReadUntil("size-43x132-"+tag, 10*time.Second)

	s.Stdin("exit 3\n")
	if c := untilControl(s, 10*time.Second); c.Type != terminal.TypeExit || c.ExitCode != 3 {
		t.Fatalf("want exit 3, got %+v", c)
	}
	if code := s.CloseStatus(5 * time.Second); code != websocket.StatusNormalClosure {
		t.Fatalf("close status %d, want 1000", code)
	}
	waitGone(t, res.PID, 5*time.Second)
	waitActive(t, m, 0)
}

func TestPTYExitCodes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, cmd string
		code      int
	}{
		{"exit 0", "exit\n", 0},
		{"exit 7", "exit 7\n", 7},
		{"killed by SIGKILL", "kill -KILL $$\n", 128 + 9},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, s, _ := openPTY(t)
			s.Stdin(tc.cmd)
			if c := untilControl(s, 10*time.Second); c.Type != terminal.TypeExit || c.ExitCode != tc.code {
				t.Fatalf("want exit %d, got %+v", tc.code, c)
			}
		})
	}
}

func mustControl(t *testing.T, c terminal.Control) []byte {
	t.Helper()
	b, err := terminal.EncodeControl(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPTYUnknownUser(t *testing.T) {
	t.Parallel()
	fx := newPKI(t)
	p := ptyParams(t, "nosuchuser"+randHex(t, 3))
	g := newGateway(t, fx, p.Nonce)
	m := newManager(t, g, clientTLS(fx.pool, fx.client))
	_, err := m.Open(context.Background(), p, "", nil)
	if codeOf(t, err) != termnode.CodePTYFailed || !strings.Contains(err.Error(), "does not exist on this node") {
		t.Fatalf("Open: %v, want terminal_pty_failed naming the missing user", err)
	}
	s := g.waitStream()
	c := s.Control(5 * time.Second)
	if c.Type != terminal.TypeError || c.Error != terminal.CodePTYFailed ||
		c.Message != fmt.Sprintf("allocation user %q does not exist on this node", p.Username) {
		t.Fatalf("gateway got %+v", c)
	}
	if code := s.CloseStatus(5 * time.Second); int(code) != terminal.ClosePTYFailed {
		t.Fatalf("close status %d, want %d", code, terminal.ClosePTYFailed)
	}
	if m.Active() != 0 {
		t.Fatalf("Active = %d", m.Active())
	}
}

// TestPTYStreamClosedKillsShell: when the gateway closes the stream, the
// shell is hung up and reaped, and its foreground job hung up too.
func TestPTYStreamClosedKillsShell(t *testing.T) {
	t.Parallel()
	m, s, res := openPTY(t)
	s.Stdin("sh -c 'echo fg-pid=$$; exec sleep 1000'\n")
	m1 := readUntilRE(t, s, regexp.MustCompile(`fg-pid=(\d+)`), 10*time.Second)
	job, _ := strconv.Atoi(m1[1])
	// Until the job has exec'd sleep, it may still be setting up signals.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", job)); string(b) == "sleep\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job never ran sleep")
		}
	}
	if processGone(res.PID) {
		t.Fatal("shell not running before the stream closed")
	}
	if err := s.Conn.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Logf("gateway close: %v", err)
	}
	waitGone(t, res.PID, 5*time.Second)
	waitGone(t, job, 5*time.Second)
	waitActive(t, m, 0)
}

// TestPTYBackpressure: a gateway that reads slowly loses nothing; the
// output arrives complete and in order.
func TestPTYBackpressure(t *testing.T) {
	t.Parallel()
	const n = 5_000_000
	_, s, _ := openPTY(t, func(o *terminaltest.Options) {
		o.Unbuffered, o.ReadDelay, o.DelayFrames = true, 2*time.Millisecond, 200
	})
	tag := randHex(t, 4)
	s.Stdin("head -c " + strconv.Itoa(n) + " /dev/zero | tr '\\0' x; echo; echo end-$((1+1))-" + tag + "\n")
	out := s.ReadUntil("end-2-"+tag, 2*time.Minute)
	longest := 0
	for _, run := range regexp.MustCompile(`x+`).FindAllString(out, -1) {
		longest = max(longest, len(run))
	}
	if longest != n {
		t.Fatalf("longest run of x = %d, want %d (output %d bytes)", longest, n, len(out))
	}
}

func TestPTYMaxLifetime(t *testing.T) {
	t.Parallel()
	fx := newPKI(t)
	p := ptyParams(t, currentUser(t))
	p.MaxLifetime = api.Duration(time.Second)
	g := newGateway(t, fx, p.Nonce)
	m := shManager(t, g, fx, p.Username)
	res, err := m.Open(context.Background(), p, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	s := g.waitStream()
	if c := s.Control(5 * time.Second); c.Type != terminal.TypeReady {
		t.Fatalf("first frame %+v", c)
	}
	c := untilControl(s, 10*time.Second)
	if c.Type != terminal.TypeError || c.Error != terminal.CodeSessionMaxLifetime {
		t.Fatalf("want error session_max_lifetime, got %+v", c)
	}
	if code := s.CloseStatus(5 * time.Second); int(code) != terminal.CloseCode(terminal.CodeSessionMaxLifetime) {
		t.Fatalf("close status %d", code)
	}
	waitGone(t, res.PID, 5*time.Second)
	waitActive(t, m, 0)
}

// TestPTYUnansweredPings: a gateway that stops reading (so never answers
// WebSocket pings) is taken for gone and the shell is ended.
func TestPTYUnansweredPings(t *testing.T) {
	t.Parallel()
	fx := newPKI(t)
	p := ptyParams(t, currentUser(t))
	g := newGateway(t, fx, p.Nonce, func(o *terminaltest.Options) { o.Raw = true })
	m := shManager(t, g, fx, p.Username, func(c *termnode.Config) { c.PingInterval = 100 * time.Millisecond })
	res, err := m.Open(context.Background(), p, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	g.waitStream()
	waitGone(t, res.PID, 5*time.Second)
	waitActive(t, m, 0)
}

// TestPTYAnsweredPings: a live gateway keeps the session through pings.
func TestPTYAnsweredPings(t *testing.T) {
	t.Parallel()
	fx := newPKI(t)
	p := ptyParams(t, currentUser(t))
	g := newGateway(t, fx, p.Nonce)
	m := shManager(t, g, fx, p.Username, func(c *termnode.Config) { c.PingInterval = 50 * time.Millisecond })
	res, err := m.Open(context.Background(), p, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	s := g.waitStream()
	if c := s.Control(5 * time.Second); c.Type != terminal.TypeReady {
		t.Fatalf("first frame %+v", c)
	}
	time.Sleep(500 * time.Millisecond)
	if processGone(res.PID) || m.Active() != 1 {
		t.Fatal("session ended although the gateway answered pings")
	}
	s.Stdin("echo still-$((2+3))\n")
	s.ReadUntil("still-5", 10*time.Second)
}

func TestManagerCloseEndsSessions(t *testing.T) {
	t.Parallel()
	m, s, res := openPTY(t)
	m.Close()
	if !processGone(res.PID) {
		t.Fatal("shell still runs after Close returned")
	}
	c := untilControl(s, 5*time.Second)
	if c.Type != terminal.TypeError || c.Error != terminal.CodeNodeOffline {
		t.Fatalf("want error node_offline, got %+v", c)
	}
	if m.Active() != 0 {
		t.Fatalf("Active = %d", m.Active())
	}
}

// TestPTYOtherUser runs the shell as a real user other than the agent's.
func TestPTYOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: this test needs root to create a user and start a shell as it")
		}
		t.Skip("needs root: creates a user with useradd and starts a shell as it")
	}
	useradd, err := exec.LookPath("useradd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: useradd is missing")
		}
		t.Skip("useradd is missing")
	}
	name := "dtt" + randHex(t, 4)
	if out, err := exec.Command(useradd, "-m", "-s", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", "-r", name).CombinedOutput(); err != nil {
			t.Logf("userdel: %v: %s", err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	_, s, res := openPTYAs(t, name, false)
	s.Stdin("echo who=$(id -un):$(id -u):$HOME:$SHELL:$(pwd):$TERM:$0\n")
	want := fmt.Sprintf("who=%s:%s:%s:/bin/sh:%s:xterm-256color:-sh", name, u.Uid, u.HomeDir, u.HomeDir)
	s.ReadUntil(want, 10*time.Second)
	s.Stdin("exit 5\n")
	if c := untilControl(s, 10*time.Second); c.Type != terminal.TypeExit || c.ExitCode != 5 {
		t.Fatalf("want exit 5, got %+v", c)
	}
	waitGone(t, res.PID, 5*time.Second)
}

// readUntilRE collects stdout until re matches it and returns the match.
func readUntilRE(t *testing.T, s *stream, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m
		}
		ev := s.Next(time.Until(deadline))
		if ev.Closed != nil || ev.Ch != terminal.ChanStdout {
			t.Fatalf("waiting for %s: got channel %s %q (closed: %v); output so far:\n%s", re, ev.Ch, ev.Payload, ev.Closed, out.String())
		}
		out.Write(ev.Payload)
	}
}
