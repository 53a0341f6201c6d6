package guestssh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"
)

// maxOutput bounds what Run keeps of a script's stdout and stderr.
const maxOutput = 256 << 10

// Conn runs shell scripts in the guest over one SSH connection: as the
// terminal key's user (Open), or as root (OpenAdmin). How OpenAdmin
// becomes root is what the guest offers: the terminal key's user
// when it is root already, else that user with passwordless sudo (what
// Drover's cloud-init seed grants the default user), else root itself
// logging in with the terminal key (a guest without sudo that authorizes
// the key for root, as the test guest does).
type Conn struct {
	client *ssh.Client
	sudo   bool
	// Via says how root was reached: "root", "sudo:<user>" or "<user>"
	// (the user is uid 0).
	Via string
}

// Open dials t as its user; Run runs scripts as that user.
func Open(ctx context.Context, t Target) (*Conn, error) {
	c, err := Dial(ctx, t, t.User)
	if err != nil {
		return nil, err
	}
	return &Conn{client: c, Via: t.User}, nil
}

// OpenAdmin dials t and finds a way to root (see Conn). It fails with a
// *DialError when the guest cannot be reached, or an error saying that
// the guest offers no root.
func OpenAdmin(ctx context.Context, t Target) (*Conn, error) {
	c, err := Dial(ctx, t, t.User)
	if err != nil {
		return nil, err
	}
	a := &Conn{client: c, Via: t.User}
	out, err := a.run(ctx, "id -u\n", false)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("guest: id -u as %s: %w", t.User, err)
	}
	if strings.TrimSpace(string(out)) == "0" {
		return a, nil
	}
	if _, err := a.run(ctx, "exit 0\n", true); err == nil {
		a.sudo, a.Via = true, "sudo:"+t.User
		return a, nil
	} else if ctx.Err() != nil {
		_ = c.Close()
		return nil, ctx.Err()
	}
	_ = c.Close()
	rc, rerr := Dial(ctx, t, "root")
	if rerr != nil {
		return nil, fmt.Errorf("guest offers no root: %s has no passwordless sudo, and root refused the terminal key: %w", t.User, rerr)
	}
	a = &Conn{client: rc, Via: "root"}
	if out, err := a.run(ctx, "id -u\n", false); err != nil || strings.TrimSpace(string(out)) != "0" {
		_ = rc.Close()
		return nil, fmt.Errorf("guest offers no root: logged in as root, id -u said %q: %v", strings.TrimSpace(string(out)), err)
	}
	return a, nil
}

// Close closes the connection.
func (a *Conn) Close() error { return a.client.Close() }

// Run runs script with sh (as root from OpenAdmin) and returns its stdout. A non-zero exit
// is an *ExitError carrying the status and stderr. ctx bounds the run:
// when it ends the session is closed.
func (a *Conn) Run(ctx context.Context, script string) ([]byte, error) {
	return a.run(ctx, script, a.sudo)
}

// ExitError is a script that exited non-zero (or was killed).
type ExitError struct {
	Status int
	Stderr string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("exit status %d: %s", e.Status, strings.TrimSpace(e.Stderr))
}

func (a *Conn) run(ctx context.Context, script string, sudo bool) ([]byte, error) {
	sess, err := a.client.NewSession()
	if err != nil {
		return nil, fmt.Errorf("open session: %w", err)
	}
	defer func() { _ = sess.Close() }()
	var stdout, stderr limitedBuffer
	sess.Stdin, sess.Stdout, sess.Stderr = strings.NewReader(script), &stdout, &stderr
	cmd := "sh -s"
	if sudo {
		cmd = "sudo -n sh -s"
	}
	stop := context.AfterFunc(ctx, func() {
		_ = sess.Signal(ssh.SIGKILL)
		_ = sess.Close()
	})
	defer stop()
	err = sess.Run(cmd)
	if ctx.Err() != nil {
		return stdout.Bytes(), fmt.Errorf("guest script: %w", ctx.Err())
	}
	var ee *ssh.ExitError
	switch {
	case errors.As(err, &ee):
		return stdout.Bytes(), &ExitError{Status: ee.ExitStatus(), Stderr: stderr.String()}
	case err != nil:
		return stdout.Bytes(), fmt.Errorf("guest script: %w", err)
	}
	return stdout.Bytes(), nil
}

// limitedBuffer keeps the first maxOutput bytes written to it.
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := maxOutput - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}
