package termnode

// Mode vm_ssh: a brokered terminal into a slice VM. The node dials the
// guest's SSH server at the address its own provision recorded (on the
// node's loopback, or the VM's own address on the slice network),
// checks the host key the guest reported at provision,
// authenticates with the VM's terminal key (all three through
// internal/node/guestssh's Dial) and asks for a PTY and a shell
// as the allocation's user. Nothing in the task names an address or a key.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/node/guestssh"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// Error codes of mode vm_ssh, each naming the hop that failed. They are
// terminal.open result codes; the browser gets them as a terminal_pty_failed
// error frame whose message starts with the code.
const (
	// CodeGuestNotOwned: the session's allocation does not own the VM (or
	// its user is not the VM's user); nothing was dialed.
	CodeGuestNotOwned = "guest_not_owned"
	// CodeGuestTerminalUnavailable: the node has no usable terminal record
	// for the VM (not provisioned here, released, no SSH address, an
	// address guestssh.CheckAddr refuses, or no pinned host key).
	CodeGuestTerminalUnavailable = guestssh.CodeUnavailable
	// CodeGuestSSHUnreachable: the guest's SSH address did not answer, or
	// the SSH handshake did not complete in time.
	CodeGuestSSHUnreachable = guestssh.CodeUnreachable
	// CodeGuestHostKeyMismatch: the guest presented a host key other than
	// the one pinned at provision; the session stops before authenticating.
	CodeGuestHostKeyMismatch = guestssh.CodeHostKeyMismatch
	// CodeGuestAuthFailed: the guest refused the VM's terminal key.
	CodeGuestAuthFailed = guestssh.CodeAuthFailed
)

// guestStopGrace bounds the wait for the guest session to end on Stop.
const guestStopGrace = 2 * time.Second

// VMTarget is what a vm_ssh session needs of a slice VM, from the node's
// own provision records: the guest's SSH address (on the node's loopback,
// or the VM's own address on the slice network: guestssh.CheckAddr), the
// user the terminal key is authorized for, the key and the pinned host
// keys.
type VMTarget = guestssh.Target

// startVMSSH opens the SSH session into the VM for p and starts its shell.
func (m *Manager) startVMSSH(ctx context.Context, vm, allocationID, username string, size terminal.Size) (console, error) {
	fail := func(code string, err error, format string, args ...any) error {
		return &Error{api.CodedError{Code: code, Message: fmt.Sprintf(format, args...), Err: err}}
	}
	if m.cfg.VMTarget == nil {
		return nil, fail(CodeGuestTerminalUnavailable, nil, "this agent cannot broker terminals into VMs")
	}
	t, err := m.cfg.VMTarget(ctx, vm, allocationID)
	if err != nil {
		var te *Error
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, fail(CodeGuestTerminalUnavailable, err, "vm %q", vm)
	}
	if t.User != username {
		return nil, fail(CodeGuestNotOwned, nil, "the terminal key of vm %q is authorized for user %q, not %q", vm, t.User, username)
	}
	client, err := guestssh.Dial(ctx, t, username)
	if err != nil {
		var de *guestssh.DialError
		if errors.As(err, &de) {
			return nil, fail(de.Code, de.Err, "vm %q: %s", vm, de.Msg)
		}
		return nil, fail(CodeGuestSSHUnreachable, err, "vm %q", vm)
	}
	c, err := startGuestShell(client, size)
	if err != nil {
		_ = client.Close()
		return nil, fail(CodePTYFailed, err, "vm %q: a PTY and shell for %q", vm, username)
	}
	return c, nil
}

// sshConsole is a shell in a PTY in the guest, over one SSH connection.
type sshConsole struct {
	client *ssh.Client
	sess   *ssh.Session
	stdin  io.WriteCloser
	out    *io.PipeReader

	mu       sync.Mutex
	code     int
	exited   chan struct{}
	stopOnce sync.Once
}

// startGuestShell requests a PTY of size and a login shell; stdout and
// stderr are merged, as in a host PTY.
func startGuestShell(client *ssh.Client, size terminal.Size) (*sshConsole, error) {
	sess, err := client.NewSession()
	if err != nil {
		return nil, fmt.Errorf("open session: %w", err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	sess.Stdout, sess.Stderr = pw, pw
	modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
	if err := sess.RequestPty("xterm-256color", int(size.Rows), int(size.Cols), modes); err != nil {
		return nil, fmt.Errorf("pty-req: %w", err)
	}
	if err := sess.Shell(); err != nil {
		return nil, fmt.Errorf("shell: %w", err)
	}
	c := &sshConsole{client: client, sess: sess, stdin: stdin, out: pr, exited: make(chan struct{})}
	go func() {
		err := sess.Wait()
		code := 0
		var ee *ssh.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitStatus()
		case err != nil:
			code = -1
		}
		c.mu.Lock()
		c.code = code
		c.mu.Unlock()
		_ = pw.Close()
		close(c.exited)
	}()
	return c, nil
}

func (c *sshConsole) Read(p []byte) (int, error) { return c.out.Read(p) }

func (c *sshConsole) Write(p []byte) (int, error) { return c.stdin.Write(p) }

// Resize sends a window-change request.
func (c *sshConsole) Resize(s terminal.Size) error {
	return c.sess.WindowChange(int(s.Rows), int(s.Cols))
}

func (c *sshConsole) Exited() <-chan struct{} { return c.exited }

func (c *sshConsole) ExitCode() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.code
}

// Stop hangs up the guest shell (SIGHUP, then the connection closes,
// which sshd answers by hanging up the PTY) and waits, bounded, for the
// session to end.
func (c *sshConsole) Stop() {
	c.stopOnce.Do(func() {
		_ = c.sess.Signal(ssh.SIGHUP)
		_ = c.client.Close()
		t := time.NewTimer(guestStopGrace)
		defer t.Stop()
		select {
		case <-c.exited:
		case <-t.C:
		}
	})
}

// Close closes the connection and unblocks Read.
func (c *sshConsole) Close() error {
	_ = c.out.CloseWithError(io.EOF)
	return c.client.Close()
}

func (c *sshConsole) PID() int { return 0 }
