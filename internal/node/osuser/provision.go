package osuser

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

// ProvisionRequest is an allocation user to create or update.
type ProvisionRequest struct {
	AllocationID string
	// Username: ^[a-z_][a-z0-9_-]{0,31}$, not root.
	Username string
	// SSHAuthorizedKeys replace the keys Drover wrote before (keys the user
	// added outside Drover's block are kept). At most MaxKeys.
	SSHAuthorizedKeys []string
	// Shell must be listed in the shells file; "" means /bin/bash when it
	// exists, else /bin/sh.
	Shell string
	// Sudo writes <SudoersDir>/drover-<username> (passwordless sudo);
	// false removes it.
	Sudo bool
}

// Verified says what Provision checked after the change.
type Verified struct {
	// User: the user resolves, with the recorded uid.
	User bool `json:"user"`
	// Home: the home directory exists and is owned by the uid.
	Home bool `json:"home"`
	// AuthorizedKeys: ~/.ssh/authorized_keys holds each requested key.
	AuthorizedKeys bool `json:"authorized_keys"`
}

// ProvisionResult is allocation.provision_user's output.
type ProvisionResult struct {
	AllocationID string `json:"allocation_id"`
	Username     string `json:"username"`
	UID          int    `json:"uid"`
	GID          int    `json:"gid"`
	Home         string `json:"home"`
	Shell        string `json:"shell"`
	// Keys is how many keys Drover's block of authorized_keys holds.
	Keys int  `json:"keys"`
	Sudo bool `json:"sudo"`
	// Created is false when the user already existed (Drover's, for this
	// allocation) and was only updated.
	Created  bool     `json:"created"`
	Verified Verified `json:"verified"`
	// RolledBack: the provision failed and everything it changed was
	// undone (a user it created deleted with its home; an existing user's
	// keys, sudoers drop-in and record put back).
	RolledBack bool `json:"rolled_back,omitempty"`
}

var usernameRE = pattern.Must(`^[a-z_][a-z0-9_-]{0,31}$`, `^[a-z_][a-z0-9_-]*$`, 1, 32)

func checkUsername(name string) error {
	if name == "root" {
		return errors.New("username must not be root")
	}
	if !usernameRE.MatchString(name) {
		return fmt.Errorf("username %q must match %s", name, usernameRE)
	}
	return nil
}

// comment is the GECOS comment of the allocation's user (":" and "," are
// not allowed there).
func comment(allocationID string) string {
	return CommentPrefix + strings.NewReplacer(":", "_", ",", "_").Replace(allocationID)
}

// owns reports whether u is the user Drover recorded in rec.
func owns(rec record, u *user.User) bool {
	if rec.Pending {
		return u.Name == comment(rec.AllocationID)
	}
	return rec.UID != "" && rec.UID == u.Uid
}

// Provision creates the allocation's user (or updates it when Drover
// created it for this allocation before), writes its authorized keys and
// sudoers drop-in, and verifies the result. A new user's home is 0700.
// Timings are "<phase>_ms" for validate, create_user, authorized_keys,
// sudoers and verify; progress, when not nil, is called after each phase.
// Errors are *Error. When a phase after validate fails, Provision undoes
// what it changed (phase "rollback"; see undoProvision): a user it
// created is deleted again with its home, sudoers drop-in and record, and
// a user that existed keeps its account but gets its previous keys,
// drop-in and record back; the error's message says what was undone.
func (m *Manager) Provision(ctx context.Context, req ProvisionRequest, progress func(phase string, d time.Duration, err error)) (ProvisionResult, map[string]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ph := &phases{now: m.opts.Now, progress: progress, timings: map[string]int64{}}
	res := ProvisionResult{AllocationID: req.AllocationID, Username: req.Username, Sudo: req.Sudo, Keys: len(req.SSHAuthorizedKeys)}
	var (
		st       state
		existing *user.User
		undo     provisionUndo
	)
	err := ph.run("validate", func() error {
		shell, err := m.validateProvision(req)
		if err != nil {
			return err
		}
		res.Shell = shell
		if st, err = m.loadState(); err != nil {
			return fail(CodeStateFailed, "validate", err, "cannot read the user state")
		}
		rec, known := st.Users[req.Username]
		if known && rec.AllocationID != req.AllocationID {
			return fail(CodeUserBoundToOtherAllocation, "validate", nil,
				"user %q belongs to allocation %q", req.Username, rec.AllocationID)
		}
		u, exists, err := m.resolveUser(req.Username)
		if err != nil {
			return fail(CodeVerifyFailed, "validate", err, "look up user %q", req.Username)
		}
		if exists && (!known || !owns(rec, u)) {
			return fail(CodeUserExistsUnmanaged, "validate", nil,
				"user %q (uid %s) exists and was not created by Drover for this allocation", req.Username, u.Uid)
		}
		existing = u
		undo.prevRec, undo.prevKnown = rec, known
		return nil
	})
	if err != nil {
		return res, ph.timings, err // nothing changed yet
	}
	failed := func(err error) (ProvisionResult, map[string]int64, error) {
		res.RolledBack = m.undoProvision(ctx, ph, &undo, &st, req, err)
		return res, ph.timings, err
	}
	var u *user.User
	err = ph.run("create_user", func() error {
		var err error
		u, err = m.createOrUpdate(ctx, &st, req, res.Shell, existing, &undo)
		return err
	})
	if err != nil {
		return failed(err)
	}
	res.Created = existing == nil
	res.Home = u.HomeDir
	uid, gid, err := ids(u)
	if err != nil {
		return failed(fail(CodeVerifyFailed, "create_user", err, "user %q", req.Username))
	}
	res.UID, res.GID = uid, gid
	undo.home, undo.uid, undo.gid = u.HomeDir, uid, gid
	err = ph.run("authorized_keys", func() error {
		var err error
		if undo.keys, err = writeAuthorizedKeys(u.HomeDir, uid, gid, req.AllocationID, req.SSHAuthorizedKeys); err != nil {
			return fail(CodeAuthorizedKeysFailed, "authorized_keys", err, "write %s/%s", u.HomeDir, authorizedKeysPath)
		}
		return nil
	})
	if err != nil {
		return failed(err)
	}
	err = ph.run("sudoers", func() error {
		var err error
		if undo.sudoers, err = snapshotFile(m.sudoersPath(req.Username)); err != nil {
			return fail(CodeSudoersInvalid, "sudoers", err, "read %s", m.sudoersPath(req.Username))
		}
		undo.sudoersTaken = true
		return m.applySudoers(ctx, req.Username, req.Sudo)
	})
	if err != nil {
		return failed(err)
	}
	err = ph.run("verify", func() error {
		var err error
		res.Verified, err = m.verifyProvision(req, u, undo.created && !undo.homePreexisted)
		return err
	})
	if err != nil {
		return failed(err)
	}
	m.opts.Log.Info("allocation user provisioned", "user", req.Username, "uid", uid,
		"allocation_id", req.AllocationID, "created", res.Created, "keys", res.Keys, "sudo", req.Sudo)
	return res, ph.timings, nil
}

// validateProvision checks req on this node and returns the shell to use.
func (m *Manager) validateProvision(req ProvisionRequest) (string, error) {
	bad := func(format string, args ...any) (string, error) {
		return "", fail(CodeInvalidParams, "validate", nil, format, args...)
	}
	if req.AllocationID == "" {
		return bad("allocation_id is required")
	}
	if err := checkUsername(req.Username); err != nil {
		return bad("%s", err)
	}
	if len(req.SSHAuthorizedKeys) > MaxKeys {
		return bad("at most %d ssh_authorized_keys, got %d", MaxKeys, len(req.SSHAuthorizedKeys))
	}
	for i, k := range req.SSHAuthorizedKeys {
		if strings.ContainsAny(k, "\r\n") {
			return bad("ssh_authorized_keys[%d] must be a single line", i)
		}
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return bad("ssh_authorized_keys[%d] is not an SSH public key: %v", i, err)
		}
	}
	shells, err := m.loginShells()
	if err != nil {
		return "", fail(CodeInvalidParams, "validate", err, "cannot read the login shells")
	}
	shell := req.Shell
	if shell == "" {
		shell = defaultSh
		if isExecutable(defaultBash) && shells[defaultBash] {
			shell = defaultBash
		}
	}
	if !shells[shell] {
		return bad("shell %q is not listed in %s", shell, m.opts.ShellsFile)
	}
	if !isExecutable(shell) {
		return bad("shell %q is not an executable file on this node", shell)
	}
	return shell, nil
}

func (m *Manager) loginShells() (map[string]bool, error) {
	b, err := os.ReadFile(m.opts.ShellsFile)
	if err != nil {
		return nil, err
	}
	shells := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			shells[line] = true
		}
	}
	return shells, sc.Err()
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// createOrUpdate runs useradd (recording the user as pending first, so
// that a crash in between leaves a user Drover can still recognise) and
// makes the new home 0700 or, for an existing user, usermod --shell; it
// records the user and returns it as resolved afterwards. undo learns
// whether useradd ran and whether the home was already there.
func (m *Manager) createOrUpdate(ctx context.Context, st *state, req ProvisionRequest, shell string, existing *user.User, undo *provisionUndo) (*user.User, error) {
	const phase = "create_user"
	now := m.opts.Now().UTC()
	rec := st.Users[req.Username]
	if rec.CreatedAt.IsZero() || existing == nil {
		rec.CreatedAt = now
	}
	if existing == nil {
		useradd, err := m.opts.LookPath("useradd")
		if err != nil {
			return nil, fail(CodeUseraddFailed, phase, err, "useradd not found")
		}
		st.Users[req.Username] = record{AllocationID: req.AllocationID, Pending: true, CreatedAt: now, UpdatedAt: now}
		if err := m.saveState(*st); err != nil {
			return nil, fail(CodeStateFailed, phase, err, "record user %q", req.Username)
		}
		undo.created = true
		out, err := m.opts.Run(ctx, useradd, useraddArgs(req.Username, shell, req.AllocationID)...)
		undo.homePreexisted = strings.Contains(string(out), homeExistsWarning)
		if err != nil {
			if exitCode(err) == useraddUserExists {
				undo.created = false // someone else's user, made since validate
			}
			delete(st.Users, req.Username)
			if serr := m.saveState(*st); serr != nil {
				m.opts.Log.Error("cannot drop the pending user record", "user", req.Username, "err", serr)
			}
			return nil, fail(CodeUseraddFailed, phase, err, "useradd %s: %s", req.Username, strings.TrimSpace(string(out)))
		}
	} else {
		usermod, err := m.opts.LookPath("usermod")
		if err != nil {
			return nil, fail(CodeUseraddFailed, phase, err, "usermod not found")
		}
		if out, err := m.opts.Run(ctx, usermod, "--shell", shell, req.Username); err != nil {
			return nil, fail(CodeUseraddFailed, phase, err, "usermod --shell %s: %s", req.Username, strings.TrimSpace(string(out)))
		}
	}
	u, ok, err := m.resolveUser(req.Username)
	if err != nil || !ok {
		return nil, fail(CodeUseraddFailed, phase, err, "user %q does not resolve after useradd", req.Username)
	}
	if existing == nil && !undo.homePreexisted {
		uid, _, err := ids(u)
		if err == nil {
			err = secureHome(u.HomeDir, uid)
		}
		if err != nil {
			return nil, fail(CodeUseraddFailed, phase, err, "make the home of %q private", req.Username)
		}
	}
	rec.AllocationID, rec.Pending, rec.UID, rec.Home, rec.Sudo, rec.UpdatedAt = req.AllocationID, false, u.Uid, u.HomeDir, req.Sudo, now
	st.Users[req.Username] = rec
	if err := m.saveState(*st); err != nil {
		return nil, fail(CodeStateFailed, phase, err, "record user %q", req.Username)
	}
	return u, nil
}

// useraddArgs are useradd's arguments for a new allocation user.
func useraddArgs(username, shell, allocationID string) []string {
	return []string{"--create-home", "--shell", shell, "--comment", comment(allocationID), username}
}

func ids(u *user.User) (uid, gid int, err error) {
	if uid, err = strconv.Atoi(u.Uid); err != nil {
		return 0, 0, fmt.Errorf("uid %q is not numeric: %w", u.Uid, err)
	}
	if gid, err = strconv.Atoi(u.Gid); err != nil {
		return 0, 0, fmt.Errorf("gid %q is not numeric: %w", u.Gid, err)
	}
	return uid, gid, nil
}

// verifyProvision re-reads what Provision did: the user resolves with the
// same uid, the home is a directory owned by it (0700 when privateHome),
// authorized_keys holds each key, and the sudoers drop-in is there exactly
// when asked for.
func (m *Manager) verifyProvision(req ProvisionRequest, want *user.User, privateHome bool) (Verified, error) {
	var v Verified
	var problems []string
	u, ok, err := m.resolveUser(req.Username)
	switch {
	case err != nil:
		problems = append(problems, "user lookup: "+err.Error())
	case !ok:
		problems = append(problems, "user does not resolve")
	case u.Uid != want.Uid:
		problems = append(problems, fmt.Sprintf("uid changed from %s to %s", want.Uid, u.Uid))
	default:
		v.User = true
	}
	uid, _, _ := ids(want)
	if fi, err := os.Stat(want.HomeDir); err != nil {
		problems = append(problems, "home: "+err.Error())
	} else if owner, ok := fileOwner(fi); !fi.IsDir() || !ok || owner != uid {
		problems = append(problems, fmt.Sprintf("home %s is not a directory owned by uid %d", want.HomeDir, uid))
	} else if privateHome && fi.Mode().Perm() != 0o700 {
		problems = append(problems, fmt.Sprintf("home %s has mode %s, want 0700", want.HomeDir, fi.Mode().Perm()))
	} else {
		v.Home = true
	}
	if missing, err := missingKeys(want.HomeDir, uid, req.SSHAuthorizedKeys); err != nil {
		problems = append(problems, "authorized_keys: "+err.Error())
	} else if missing > 0 {
		problems = append(problems, fmt.Sprintf("authorized_keys lacks %d of %d keys", missing, len(req.SSHAuthorizedKeys)))
	} else {
		v.AuthorizedKeys = true
	}
	_, err = os.Lstat(m.sudoersPath(req.Username))
	switch {
	case req.Sudo && err != nil:
		problems = append(problems, "sudoers drop-in: "+err.Error())
	case !req.Sudo && !errors.Is(err, fs.ErrNotExist):
		problems = append(problems, "sudoers drop-in still present")
	}
	if problems != nil {
		return v, fail(CodeVerifyFailed, "verify", nil, "%s", strings.Join(problems, "; "))
	}
	return v, nil
}
