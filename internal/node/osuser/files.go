package osuser

// The files Provision writes: ~/.ssh/authorized_keys (inside the user's
// home, through os.Root so that a symlink planted by the user cannot send
// a root-owned write elsewhere) and the sudoers drop-in.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/drover-dev/drover/internal/node/atomicfile"

	"golang.org/x/crypto/ssh"
)

// keysSnapshot is what writeAuthorizedKeys found before it changed
// anything, so that a failed provision can put it back.
type keysSnapshot struct {
	// Changed: .ssh or authorized_keys may have been changed.
	Changed bool
	// SSHDir: .ssh existed; File: authorized_keys existed, holding Content.
	SSHDir, File bool
	Content      []byte
}

// writeAuthorizedKeys replaces Drover's block of home/.ssh/authorized_keys
// with keys (lines outside the block are kept) and makes .ssh 0700 and the
// file 0600, both owned by uid:gid. It returns what was there before,
// also on failure.
func writeAuthorizedKeys(home string, uid, gid int, allocationID string, keys []string) (keysSnapshot, error) {
	var snap keysSnapshot
	root, err := os.OpenRoot(home)
	if err != nil {
		return snap, err
	}
	defer root.Close()
	fi, err := root.Lstat(".ssh")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		snap.Changed = true
		if err := root.Mkdir(".ssh", 0o700); err != nil {
			return snap, err
		}
	case err != nil:
		return snap, err
	case !fi.IsDir():
		return snap, fmt.Errorf("%s/.ssh is not a directory (%s)", home, fi.Mode().Type())
	default:
		snap.SSHDir = true
	}
	fi, err = root.Lstat(authorizedKeysPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return snap, err
	case !fi.Mode().IsRegular():
		return snap, fmt.Errorf("%s/%s is not a regular file (%s)", home, authorizedKeysPath, fi.Mode().Type())
	default:
		if snap.Content, err = root.ReadFile(authorizedKeysPath); err != nil {
			return snap, err
		}
		snap.File = true
	}
	snap.Changed = true
	if err := root.Chmod(".ssh", 0o700); err != nil {
		return snap, err
	}
	if err := root.Lchown(".ssh", uid, gid); err != nil {
		return snap, err
	}
	return snap, replaceKeysFile(root, uid, gid, mergeKeys(snap.Content, allocationID, keys))
}

// replaceKeysFile replaces .ssh/authorized_keys below root with content
// (0600, uid:gid), through a temporary file renamed into place.
func replaceKeysFile(root *os.Root, uid, gid int, content []byte) error {
	if err := root.Remove(authorizedKeysTmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := root.OpenFile(authorizedKeysTmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	werr := func() error {
		if err := f.Chmod(0o600); err != nil {
			return err
		}
		if err := f.Chown(uid, gid); err != nil {
			return err
		}
		if _, err := f.Write(content); err != nil {
			return err
		}
		return f.Sync()
	}()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = root.Rename(authorizedKeysTmp, authorizedKeysPath)
	}
	if werr != nil {
		_ = root.Remove(authorizedKeysTmp)
		return werr
	}
	d, err := root.Open(".ssh")
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// mergeKeys returns old without Drover's block, followed by a new block
// holding keys (none when keys is empty).
func mergeKeys(old []byte, allocationID string, keys []string) []byte {
	var b bytes.Buffer
	inBlock := false
	sc := bufio.NewScanner(bytes.NewReader(old))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, keysBegin):
			inBlock = true
		case inBlock && strings.HasPrefix(line, keysEnd):
			inBlock = false
		case !inBlock:
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	if len(keys) > 0 {
		fmt.Fprintf(&b, "%s (allocation %s; replaced on every provision)\n", keysBegin, allocationID)
		for _, k := range keys {
			b.WriteString(strings.TrimSpace(k))
			b.WriteByte('\n')
		}
		b.WriteString(keysEnd + "\n")
	}
	return b.Bytes()
}

// missingKeys counts the keys that home/.ssh/authorized_keys lacks; the
// file must be a regular 0600 file owned by uid.
func missingKeys(home string, uid int, keys []string) (int, error) {
	root, err := os.OpenRoot(home)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	fi, err := root.Lstat(authorizedKeysPath)
	if err != nil {
		return 0, err
	}
	if owner, ok := fileOwner(fi); !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || !ok || owner != uid {
		return 0, fmt.Errorf("not a regular 0600 file owned by uid %d (mode %s)", uid, fi.Mode())
	}
	b, err := root.ReadFile(authorizedKeysPath)
	if err != nil {
		return 0, err
	}
	have := map[string]bool{}
	for rest := b; len(bytes.TrimSpace(rest)) > 0; {
		pk, _, _, next, err := ssh.ParseAuthorizedKey(rest)
		if err != nil {
			break // only comments and blank lines are left
		}
		have[string(pk.Marshal())] = true
		rest = next
	}
	missing := 0
	for _, k := range keys {
		pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil || !have[string(pk.Marshal())] {
			missing++
		}
	}
	return missing, nil
}

func (m *Manager) sudoersPath(username string) string {
	return filepath.Join(m.opts.SudoersDir, sudoersPrefix+username)
}

// sudoersLine grants passwordless sudo.
func sudoersLine(username string) string { return username + " ALL=(ALL) NOPASSWD:ALL" }

// applySudoers writes the drop-in (0440, checked with visudo -cf when
// visudo exists) when sudo is true, else removes it. The temporary file's
// name holds a ".", so sudo's #includedir skips it.
func (m *Manager) applySudoers(ctx context.Context, username string, sudo bool) error {
	const phase = "sudoers"
	path := m.sudoersPath(username)
	if !sudo {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fail(CodeSudoersInvalid, phase, err, "remove %s", path)
		}
		return nil
	}
	if fi, err := os.Stat(m.opts.SudoersDir); err != nil || !fi.IsDir() {
		return fail(CodeSudoersInvalid, phase, err, "%s is not a directory: is sudo installed?", m.opts.SudoersDir)
	}
	tmp := filepath.Join(m.opts.SudoersDir, "."+sudoersPrefix+username+".tmp")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(CodeSudoersInvalid, phase, err, "remove stale %s", tmp)
	}
	content := "# Managed by drover-agent for an allocation user; replaced or removed by Drover.\n" + sudoersLine(username) + "\n"
	if err := writeNew(tmp, []byte(content), 0o440); err != nil {
		return fail(CodeSudoersInvalid, phase, err, "write %s", tmp)
	}
	if visudo, err := m.opts.LookPath("visudo"); err == nil {
		if out, err := m.opts.Run(ctx, visudo, "-cf", tmp); err != nil {
			_ = os.Remove(tmp)
			return fail(CodeSudoersInvalid, phase, err, "visudo -cf rejected the drop-in: %s", strings.TrimSpace(string(out)))
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fail(CodeSudoersInvalid, phase, err, "install %s", path)
	}
	if err := atomicfile.SyncDir(m.opts.SudoersDir); err != nil {
		return fail(CodeSudoersInvalid, phase, err, "sync %s", m.opts.SudoersDir)
	}
	return nil
}

// writeNew creates path (it must not exist) with data and mode perm.
func writeNew(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	werr := f.Chmod(perm)
	if werr == nil {
		_, werr = f.Write(data)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(path)
	}
	return werr
}
