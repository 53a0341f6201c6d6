//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package termnode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/drover-dev/drover/internal/wire/terminal"

	"github.com/drover-dev/drover/internal/wire/api"
)

// shellPATH is the login shell's PATH; the shell's profile may extend it.
const shellPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// killGrace is how long a shell has between SIGHUP and SIGKILL.
const killGrace = 2 * time.Second

// ptyConsole is a login shell in a PTY, in its own session and process
// group.
type ptyConsole struct {
	f   *os.File // the PTY master, in non-blocking mode so Close unblocks Read
	cmd *exec.Cmd
	pid int

	mu       sync.Mutex
	reaped   bool // cmd.Wait returned: pid may be reused, never signal it again
	code     int
	exited   chan struct{}
	stopOnce sync.Once
}

// startPTY starts username's login shell (from the passwd file at passwd)
// in a PTY of the given size. The agent must be root, or be username itself.
func startPTY(username string, size terminal.Size, passwd string) (console, error) {
	fail := func(err error, format string, args ...any) error {
		return &Error{api.CodedError{Code: CodePTYFailed, Message: fmt.Sprintf(format, args...), Err: err}}
	}
	u, err := user.Lookup(username)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return nil, fail(nil, "allocation user %q does not exist on this node", username)
		}
		return nil, fail(err, "cannot look up user %q", username)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fail(err, "user %q has a non-numeric uid or gid", username)
	}
	attr := &syscall.SysProcAttr{}
	switch euid := os.Geteuid(); {
	case euid == 0:
		cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if g, err := strconv.ParseUint(id, 10, 32); err == nil {
					cred.Groups = append(cred.Groups, uint32(g))
				}
			}
		}
		attr.Credential = cred
	case uint64(euid) != uid:
		return nil, fail(nil, "the agent runs as uid %d, not root, so it cannot start a shell as %q (uid %d)", euid, username, uid)
	}
	home := u.HomeDir
	if st, err := os.Stat(home); home == "" || err != nil || !st.IsDir() {
		home = "/"
	}
	shell := loginShell(passwd, username)
	cmd := exec.Command(shell)
	cmd.Args = []string{"-" + filepath.Base(shell)} // a login shell, as login(1) starts it
	cmd.Dir = home
	cmd.Env = []string{"HOME=" + home, "USER=" + username, "LOGNAME=" + username, "SHELL=" + shell,
		"PATH=" + shellPATH, "TERM=xterm-256color", "LANG=C.UTF-8"}
	cmd.SysProcAttr = attr // StartWithSize adds Setsid and Setctty
	master, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: size.Rows, Cols: size.Cols})
	if err != nil {
		return nil, fail(err, "cannot start the login shell %s as %q", shell, username)
	}
	c := &ptyConsole{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go c.wait()
	if c.f, err = pollable(master); err != nil {
		c.Stop()
		return nil, fail(err, "cannot set up the PTY")
	}
	return c, nil
}

// pollable returns f's descriptor as a non-blocking, poller-backed file, so
// that Close unblocks a Read in progress (creack/pty leaves the master in
// blocking mode). f is closed.
func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	syscall.ForkLock.RLock()
	fd, err := syscall.Dup(int(f.Fd()))
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("dup PTY master: %w", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("PTY master non-blocking: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// wait reaps the shell and records its exit code.
func (c *ptyConsole) wait() {
	_ = c.cmd.Wait()
	code := -1
	if ps := c.cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		} else {
			code = ps.ExitCode()
		}
	}
	c.mu.Lock()
	c.reaped, c.code = true, code
	c.mu.Unlock()
	close(c.exited)
}

func (c *ptyConsole) Read(p []byte) (int, error) { return c.f.Read(p) }

func (c *ptyConsole) Write(p []byte) (int, error) { return c.f.Write(p) }

// Resize sets the PTY's window size; the kernel sends SIGWINCH to the
// foreground process group.
func (c *ptyConsole) Resize(s terminal.Size) error {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: s.Rows, Col: s.Cols})
	}); err != nil {
		return err
	}
	return ierr
}

func (c *ptyConsole) Exited() <-chan struct{} { return c.exited }

func (c *ptyConsole) ExitCode() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.code
}

func (c *ptyConsole) PID() int { return c.pid }

// Stop hangs up the shell's process group, kills it after killGrace and
// waits until the shell is reaped. A shell that already exited is left
// alone (the kernel hung up its foreground job when it exited).
func (c *ptyConsole) Stop() {
	c.stopOnce.Do(func() {
		if !c.signal(syscall.SIGHUP) {
			return
		}
		t := time.NewTimer(killGrace)
		defer t.Stop()
		select {
		case <-c.exited:
			return
		case <-t.C:
		}
		c.signal(syscall.SIGKILL)
		t.Reset(killGrace)
		select {
		case <-c.exited:
		case <-t.C: // stuck in the kernel; wait reaps it whenever it dies
		}
	})
}

// signal sends sig to the shell's process group, or to the shell itself
// should it have left the group; never both, since bash takes a second
// SIGHUP during its hangup handling as "die now" and skips hanging up its
// jobs. It reports false when the shell was already reaped: its pid may
// belong to someone else by now.
func (c *ptyConsole) signal(sig syscall.Signal) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reaped {
		return false
	}
	if err := syscall.Kill(-c.pid, sig); err != nil {
		_ = syscall.Kill(c.pid, sig)
	}
	return true
}

func (c *ptyConsole) Close() error {
	if c.f == nil {
		return nil
	}
	return c.f.Close()
}
