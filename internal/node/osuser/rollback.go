package osuser

// Undoing a failed Provision: a user it created is removed again (with the
// home useradd made for it), and for a user that existed before, the
// authorized_keys, sudoers drop-in and state record go back to what they
// were, so that a failed provision leaves no way in behind.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// rollbackTimeout bounds the undo, which runs even when the task's context
// has ended.
const rollbackTimeout = time.Minute

// homeExistsWarning is what useradd (LC_ALL=C) prints when --create-home
// finds the directory already there: the home is then not its to remove.
const homeExistsWarning = "already exists"

// provisionUndo is what one Provision call changed, as it went.
type provisionUndo struct {
	// prevRec/prevKnown: the user's state record before the call.
	prevRec   record
	prevKnown bool
	// created: useradd ran for a user that did not exist (it may have
	// failed half way); homePreexisted: useradd found the home there.
	created, homePreexisted bool
	// home, uid, gid: the user's, once resolved.
	home     string
	uid, gid int
	keys     keysSnapshot
	// sudoers is the drop-in before the sudoers phase (when taken).
	sudoers      fileSnapshot
	sudoersTaken bool
}

// fileSnapshot is a file's content, or its absence.
type fileSnapshot struct {
	Exists  bool
	Content []byte
}

func snapshotFile(path string) (fileSnapshot, error) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fileSnapshot{}, nil
	case err != nil:
		return fileSnapshot{}, err
	}
	return fileSnapshot{Exists: true, Content: b}, nil
}

// undoProvision reverts what u records after cause made Provision fail,
// and says so in cause's message. It reports whether everything was
// undone.
func (m *Manager) undoProvision(ctx context.Context, ph *phases, u *provisionUndo, st *state, req ProvisionRequest, cause error) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	var did, problems []string
	_ = ph.run("rollback", func() error {
		if u.created {
			did, problems = m.undoCreate(ctx, u, st, req)
		} else {
			did, problems = m.undoUpdate(u, st, req)
		}
		if err := m.saveState(*st); err != nil {
			problems = append(problems, "state: "+err.Error())
		}
		if problems != nil {
			return errors.New(strings.Join(problems, "; "))
		}
		return nil
	})
	var e *Error
	if errors.As(cause, &e) {
		if len(did) > 0 {
			e.Message += "; rolled back: " + strings.Join(did, ", ")
		}
		if len(problems) > 0 {
			e.Message += "; rollback incomplete: " + strings.Join(problems, "; ")
		}
	}
	log := m.opts.Log.With("user", req.Username, "allocation_id", req.AllocationID, "cause", cause)
	if len(problems) > 0 {
		log.Error("failed provision not fully rolled back", "undone", did, "problems", problems)
		return false
	}
	log.Warn("failed provision rolled back", "undone", did)
	return true
}

// undoCreate removes the user this call created (its processes, the user,
// the home useradd made, its sudoers drop-in) and forgets it. A user of
// that name that is not the one created here is left alone; when userdel
// fails the record stays, so that a deprovision can still remove it.
func (m *Manager) undoCreate(ctx context.Context, u *provisionUndo, st *state, req ProvisionRequest) (did, problems []string) {
	keepRecord := false
	usr, ok, err := m.resolveUser(req.Username)
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("look up user %q: %v", req.Username, err))
		keepRecord = true
	case ok && usr.Name != comment(req.AllocationID):
		problems = append(problems, fmt.Sprintf("user %q (comment %q) is not the one this provision created; left alone",
			req.Username, usr.Name))
	case ok:
		_ = m.killProcesses(ctx, req.Username)
		if err := m.deleteUser(ctx, DeprovisionRequest{AllocationID: req.AllocationID, Username: req.Username,
			RemoveHome: !u.homePreexisted}); err != nil {
			problems = append(problems, err.Error())
			keepRecord = true
			break
		}
		did = append(did, "deleted user "+req.Username)
		if !u.homePreexisted && usr.HomeDir != "" {
			if _, err := os.Lstat(usr.HomeDir); !errors.Is(err, fs.ErrNotExist) {
				problems = append(problems, "home "+usr.HomeDir+" remains")
			} else {
				did = append(did, "removed home "+usr.HomeDir)
			}
		}
	}
	path := m.sudoersPath(req.Username)
	switch err := os.Remove(path); {
	case err == nil:
		did = append(did, "removed "+path)
	case !errors.Is(err, fs.ErrNotExist):
		problems = append(problems, fmt.Sprintf("remove %s: %v", path, err))
	}
	if !keepRecord {
		delete(st.Users, req.Username)
	}
	return did, problems
}

// undoUpdate puts back the authorized_keys, sudoers drop-in and record of
// a user that existed before the call; the user itself stays.
func (m *Manager) undoUpdate(u *provisionUndo, st *state, req ProvisionRequest) (did, problems []string) {
	if u.keys.Changed {
		if err := restoreAuthorizedKeys(u.home, u.uid, u.gid, u.keys); err != nil {
			problems = append(problems, fmt.Sprintf("restore %s/%s: %v", u.home, authorizedKeysPath, err))
		} else {
			did = append(did, "restored "+filepath.Join(u.home, authorizedKeysPath))
		}
	}
	if u.sudoersTaken {
		path := m.sudoersPath(req.Username)
		if err := m.restoreSudoers(path, u.sudoers); err != nil {
			problems = append(problems, fmt.Sprintf("restore %s: %v", path, err))
		} else {
			did = append(did, "restored "+path)
		}
	}
	if u.prevKnown {
		st.Users[req.Username] = u.prevRec
	} else {
		delete(st.Users, req.Username)
	}
	return did, problems
}

// restoreAuthorizedKeys puts home/.ssh/authorized_keys (and .ssh) back as
// snap found them, inside the home through os.Root.
func restoreAuthorizedKeys(home string, uid, gid int, snap keysSnapshot) error {
	root, err := os.OpenRoot(home)
	if err != nil {
		return err
	}
	defer root.Close()
	if snap.File {
		return replaceKeysFile(root, uid, gid, snap.Content)
	}
	for _, name := range []string{authorizedKeysTmp, authorizedKeysPath} {
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if !snap.SSHDir {
		if err := root.Remove(".ssh"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// restoreSudoers puts the drop-in back as snap found it (it passed visudo
// when it was installed).
func (m *Manager) restoreSudoers(path string, snap fileSnapshot) error {
	if !snap.Exists {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".restore")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := writeNew(tmp, snap.Content, 0o440); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// secureHome makes the home useradd just created 0700 (useradd applies
// the host's UMASK or HOME_MODE, often 0755): it must be a directory, not
// a symlink, owned by uid.
func secureHome(home string, uid int) error {
	fi, err := os.Lstat(home)
	if err != nil {
		return err
	}
	if owner, ok := fileOwner(fi); !fi.IsDir() || !ok || owner != uid {
		return fmt.Errorf("home %s is not a directory owned by uid %d (%s)", home, uid, fi.Mode())
	}
	return os.Chmod(home, 0o700)
}
