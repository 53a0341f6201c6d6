// Package osuser owns the OS users of bare-metal allocations
// (allocation.provision_user and allocation.deprovision_user): it creates
// and removes them with the system tools (useradd, usermod, userdel,
// pkill, visudo), writes their SSH authorized keys and sudoers drop-in,
// verifies the result, and records in a state file which users it created
// and for which allocation, so that it never touches an account it did not
// create and never hands one allocation's user to another.
//
// It must not edit /etc/passwd, /etc/shadow or /etc/group by hand, run
// anything but those tools, decide who may have an account (the control
// plane does), or keep package-level mutable state. It runs on Linux only:
// New fails elsewhere.
package osuser

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Error codes, stable: they become the task result's error code.
const (
	CodeInvalidParams              = "invalid_params"
	CodeUserExistsUnmanaged        = "user_exists_unmanaged"
	CodeUserBoundToOtherAllocation = "user_bound_to_other_allocation"
	CodeUseraddFailed              = "useradd_failed"
	CodeUserdelFailed              = "userdel_failed"
	CodeAuthorizedKeysFailed       = "authorized_keys_failed"
	CodeSudoersInvalid             = "sudoers_invalid"
	CodeVerifyFailed               = "verify_failed"
	// CodeStateFailed: the state file could not be read or written.
	CodeStateFailed = "state_failed"
)

// Limits and defaults.
const (
	// MaxKeys bounds the SSH keys of one user.
	MaxKeys = 64
	// StateFileName is the state file in Options.StateDir.
	StateFileName     = "osusers.json"
	DefaultShellsFile = "/etc/shells"
	DefaultSudoersDir = "/etc/sudoers.d"
	// CommentPrefix + allocation id is the GECOS comment of a user Drover
	// created.
	CommentPrefix = "drover allocation "
)

const (
	sudoersPrefix      = "drover-"
	userdelAttempts    = 5
	userdelRetryDelay  = 300 * time.Millisecond
	pkillNoProcess     = 1 // pkill: nothing matched
	userdelNoSuchUser  = 6 // userdel: the user does not exist
	useraddUserExists  = 9 // useradd: the user name is taken
	defaultBash        = "/bin/bash"
	defaultSh          = "/bin/sh"
	authorizedKeysPath = ".ssh/authorized_keys"
	authorizedKeysTmp  = ".ssh/.authorized_keys.drover-tmp"
	keysBegin          = "# BEGIN drover-managed keys"
	keysEnd            = "# END drover-managed keys"
)

// ErrUnsupported: New on an OS other than Linux.
var ErrUnsupported = errors.New("osuser: not supported")

// Error is a failed operation: a stable Code, the Phase it failed in and a
// message for people (an api.CodedError, its own type so the agent's
// errors.As tells it apart; its message keeps the "osuser: " prefix and
// always names the phase).
type Error struct {
	api.CodedError
}

func (e *Error) Error() string {
	msg := "osuser: " + e.Phase + ": " + e.Code + ": " + e.Message
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// CodeOf returns err's code, or "" when err is not an *Error.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func fail(code, phase string, err error, format string, args ...any) *Error {
	return &Error{api.CodedError{Code: code, Phase: phase, Message: fmt.Sprintf(format, args...), Err: err}}
}

// Runner runs a system tool (an absolute path) and returns its combined
// output. A non-zero exit is an error with an ExitCode() int method (as
// *exec.ExitError has).
type Runner func(ctx context.Context, path string, args ...string) ([]byte, error)

// ExecRunner runs the tool with os/exec and LC_ALL=C.
func ExecRunner(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

// Options configure a Manager. StateDir is required.
type Options struct {
	// StateDir holds the state file (osusers.json); created 0700 if missing.
	StateDir string
	// Run runs system tools; default ExecRunner.
	Run Runner
	// LookPath finds a tool; default exec.LookPath, then /usr/sbin, /sbin,
	// /usr/bin and /bin (an agent's PATH may lack the sbin directories).
	LookPath func(name string) (string, error)
	// LookupUser resolves a user name; default os/user.Lookup.
	LookupUser func(name string) (*user.User, error)
	// ShellsFile lists the login shells; default /etc/shells.
	ShellsFile string
	// SudoersDir is where sudoers drop-ins go; default /etc/sudoers.d.
	SudoersDir string
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Manager provisions and deprovisions allocation users. Its methods are
// safe for concurrent use (they run one at a time).
type Manager struct {
	opts Options
	mu   sync.Mutex
}

// New returns a Manager. It fails on an OS other than Linux
// (ErrUnsupported) and without a StateDir.
func New(opts Options) (*Manager, error) {
	return newManager(goruntime.GOOS, opts)
}

func newManager(goos string, opts Options) (*Manager, error) {
	if goos != "linux" {
		return nil, fmt.Errorf("%w on %s: allocation users need Linux (useradd, userdel)", ErrUnsupported, goos)
	}
	if opts.StateDir == "" {
		return nil, errors.New("osuser: Options.StateDir is required")
	}
	if opts.Run == nil {
		opts.Run = ExecRunner
	}
	if opts.LookPath == nil {
		opts.LookPath = lookPathSbin
	}
	if opts.LookupUser == nil {
		opts.LookupUser = user.Lookup
	}
	if opts.ShellsFile == "" {
		opts.ShellsFile = DefaultShellsFile
	}
	if opts.SudoersDir == "" {
		opts.SudoersDir = DefaultSudoersDir
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Manager{opts: opts}, nil
}

func lookPathSbin(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		c := filepath.Join(dir, name)
		if fi, serr := os.Stat(c); serr == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", err
}

// exitCode returns err's exit status, or -1.
func exitCode(err error) int {
	var ec interface{ ExitCode() int }
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return -1
}

// phases times the phases of one operation and reports each.
type phases struct {
	now      func() time.Time
	progress func(phase string, d time.Duration, err error)
	timings  map[string]int64
}

func (p *phases) run(name string, fn func() error) error {
	start := p.now()
	err := fn()
	d := p.now().Sub(start)
	p.timings[name+"_ms"] = d.Milliseconds()
	if p.progress != nil {
		p.progress(name, d, err)
	}
	return err
}

// resolveUser looks name up; ok is false when it does not exist.
func (m *Manager) resolveUser(name string) (u *user.User, ok bool, err error) {
	u, err = m.opts.LookupUser(name)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return u, true, nil
}
