package osuser

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"time"
)

// DeprovisionRequest is an allocation user to remove.
type DeprovisionRequest struct {
	AllocationID string
	Username     string
	// RemoveHome removes the home directory (userdel --remove).
	RemoveHome bool
}

// DeprovisionResult is allocation.deprovision_user's output.
type DeprovisionResult struct {
	AllocationID string `json:"allocation_id"`
	Username     string `json:"username"`
	// Removed: this call deleted the user.
	Removed bool `json:"removed"`
	// HomeRemoved: the home directory is gone.
	HomeRemoved bool   `json:"home_removed"`
	Home        string `json:"home,omitempty"`
	// AlreadyAbsent: there was no such user (never created, or already
	// removed); nothing but a stale record or drop-in was cleaned up.
	AlreadyAbsent bool `json:"already_absent"`
}

// Deprovision kills the allocation user's processes, deletes it (userdel,
// with --remove when RemoveHome), removes its sudoers drop-in, verifies it
// no longer resolves and forgets it. It refuses users Drover did not create
// or created for another allocation. Timings are "<phase>_ms" for validate,
// kill_processes, delete_user, sudoers and verify. Errors are *Error.
func (m *Manager) Deprovision(ctx context.Context, req DeprovisionRequest, progress func(phase string, d time.Duration, err error)) (DeprovisionResult, map[string]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ph := &phases{now: m.opts.Now, progress: progress, timings: map[string]int64{}}
	res := DeprovisionResult{AllocationID: req.AllocationID, Username: req.Username}
	var (
		st     state
		known  bool
		exists bool
	)
	err := ph.run("validate", func() error {
		if req.AllocationID == "" {
			return fail(CodeInvalidParams, "validate", nil, "allocation_id is required")
		}
		if err := checkUsername(req.Username); err != nil {
			return fail(CodeInvalidParams, "validate", nil, "%s", err)
		}
		var err error
		if st, err = m.loadState(); err != nil {
			return fail(CodeStateFailed, "validate", err, "cannot read the user state")
		}
		var rec record
		rec, known = st.Users[req.Username]
		if known && rec.AllocationID != req.AllocationID {
			return fail(CodeUserBoundToOtherAllocation, "validate", nil,
				"user %q belongs to allocation %q", req.Username, rec.AllocationID)
		}
		u, ok, err := m.resolveUser(req.Username)
		if err != nil {
			return fail(CodeVerifyFailed, "validate", err, "look up user %q", req.Username)
		}
		exists = ok
		if exists && (!known || !owns(rec, u)) {
			return fail(CodeUserExistsUnmanaged, "validate", nil,
				"user %q (uid %s) was not created by Drover for this allocation; not removing it", req.Username, u.Uid)
		}
		if exists {
			res.Home = u.HomeDir
		} else {
			res.Home = rec.Home
		}
		return nil
	})
	if err != nil {
		return res, ph.timings, err
	}
	res.AlreadyAbsent = !exists
	if exists {
		_ = ph.run("kill_processes", func() error { return m.killProcesses(ctx, req.Username) })
		err = ph.run("delete_user", func() error { return m.deleteUser(ctx, req) })
		if err != nil {
			return res, ph.timings, err
		}
		res.Removed = true
	}
	if res.Home != "" {
		_, serr := os.Lstat(res.Home)
		res.HomeRemoved = errors.Is(serr, fs.ErrNotExist)
	}
	err = ph.run("sudoers", func() error { return m.applySudoers(ctx, req.Username, false) })
	if err != nil {
		return res, ph.timings, err
	}
	err = ph.run("verify", func() error {
		_, still, err := m.resolveUser(req.Username)
		switch {
		case err != nil:
			return fail(CodeVerifyFailed, "verify", err, "look up user %q", req.Username)
		case still:
			return fail(CodeVerifyFailed, "verify", nil, "user %q still resolves after userdel", req.Username)
		}
		if known {
			delete(st.Users, req.Username)
			if err := m.saveState(st); err != nil {
				return fail(CodeStateFailed, "verify", err, "forget user %q", req.Username)
			}
		}
		if exists && req.RemoveHome && !res.HomeRemoved {
			return fail(CodeUserdelFailed, "verify", nil, "user %q removed but its home %s remains", req.Username, res.Home)
		}
		return nil
	})
	if err != nil {
		return res, ph.timings, err
	}
	m.opts.Log.Info("allocation user deprovisioned", "user", req.Username, "allocation_id", req.AllocationID,
		"removed", res.Removed, "home_removed", res.HomeRemoved, "already_absent", res.AlreadyAbsent)
	return res, ph.timings, nil
}

// killProcesses sends SIGKILL to the user's processes (pkill -KILL -u);
// no pkill and no matching process are fine: userdel then reports a user
// still in use.
func (m *Manager) killProcesses(ctx context.Context, username string) error {
	pkill, err := m.opts.LookPath("pkill")
	if err != nil {
		m.opts.Log.Warn("pkill not found; not killing the user's processes", "user", username)
		return nil
	}
	out, err := m.opts.Run(ctx, pkill, "-KILL", "-u", username)
	if err != nil && exitCode(err) != pkillNoProcess {
		m.opts.Log.Warn("pkill failed", "user", username, "err", err, "output", strings.TrimSpace(string(out)))
		return err
	}
	return nil
}

// userdelArgs are userdel's arguments.
func userdelArgs(username string, removeHome bool) []string {
	if removeHome {
		return []string{"--remove", username}
	}
	return []string{username}
}

// deleteUser runs userdel, retrying (after another pkill) while processes
// that were just killed are still exiting. The user must be gone after.
func (m *Manager) deleteUser(ctx context.Context, req DeprovisionRequest) error {
	const phase = "delete_user"
	userdel, err := m.opts.LookPath("userdel")
	if err != nil {
		return fail(CodeUserdelFailed, phase, err, "userdel not found")
	}
	var out []byte
	for attempt := 1; ; attempt++ {
		out, err = m.opts.Run(ctx, userdel, userdelArgs(req.Username, req.RemoveHome)...)
		if err == nil || exitCode(err) == userdelNoSuchUser {
			break
		}
		if _, still, lerr := m.resolveUser(req.Username); lerr == nil && !still {
			break // deleted, but a later step (e.g. the mail spool) failed
		}
		if attempt == userdelAttempts || ctx.Err() != nil {
			return fail(CodeUserdelFailed, phase, err, "userdel %s: %s", req.Username, strings.TrimSpace(string(out)))
		}
		_ = m.killProcesses(ctx, req.Username)
		t := time.NewTimer(userdelRetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	if err != nil && exitCode(err) != userdelNoSuchUser {
		m.opts.Log.Warn("userdel reported a problem after deleting the user", "user", req.Username,
			"err", err, "output", strings.TrimSpace(string(out)))
	}
	if _, still, lerr := m.resolveUser(req.Username); lerr != nil || still {
		return fail(CodeUserdelFailed, phase, lerr, "user %q still resolves after userdel: %s", req.Username, strings.TrimSpace(string(out)))
	}
	return nil
}
