//go:build linux

package oci

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Layers are applied as OCI's image spec says:
//
//   - entry names are cleaned; a name with a ".." component is refused
//     (ErrUnsafePath), a leading "/" or "./" is dropped;
//   - the parent directories of an entry are resolved inside the tree
//     (a symlink among them is followed as if the tree were the root, so it
//     cannot lead out of it), missing ones are created 0755 root:root; the
//     entry's own name is never followed: what is there is replaced;
//   - ".wh.<name>" deletes <name> of the lower layers; ".wh..wh..opq"
//     empties its directory of what lower layers put there;
//   - regular files, directories, symlinks and hard links (whose target
//     must be in the tree and not a directory) are created; character and
//     block devices and fifos too when the agent runs as root, otherwise
//     skipped with a warning;
//   - uid, gid, mode (setuid, setgid and sticky bits included), mtime and
//     extended attributes are kept (directory times set last).
//
// Keeping ownership needs root (lchown), as the agent runs; mkfs.ext4 -d
// then copies uid, gid, mode and times into the filesystem.

// extractLayers applies the layer blobs at paths, in order, to a new tree.
func extractLayers(ctx context.Context, tree string, layers []Layer, paths []string, image string,
	progress ProgressFunc, log *slog.Logger) (treeStats, error) {
	if err := os.Mkdir(tree, 0o755); err != nil {
		return treeStats{}, &BuildError{Path: tree, Err: err}
	}
	a := &applier{root: tree, dirTimes: map[string]time.Time{}, root0: os.Geteuid() == 0, log: log}
	for i, l := range layers {
		if err := a.layer(ctx, l, paths[i], image, progress); err != nil {
			return treeStats{}, err
		}
	}
	for p, t := range a.dirTimes {
		if err := os.Chtimes(p, t, t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return treeStats{}, &BuildError{Path: a.rel(p), Err: err}
		}
	}
	return statTree(tree)
}

type applier struct {
	root     string
	root0    bool                 // running as root: chown and mknod work
	dirTimes map[string]time.Time // host path → mtime, set after all layers
	seen     map[string]bool      // host paths the current layer wrote (and their parents)
	log      *slog.Logger
}

func (a *applier) rel(host string) string {
	r, err := filepath.Rel(a.root, host)
	if err != nil {
		return host
	}
	return "/" + filepath.ToSlash(r)
}

// layer applies one blob.
func (a *applier) layer(ctx context.Context, l Layer, blob, image string, progress ProgressFunc) error {
	f, err := os.Open(blob)
	if err != nil {
		return &BuildError{Layer: l.Digest, Err: err}
	}
	defer func() { _ = f.Close() }()
	r, closeR, err := decompress(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return &BuildError{Layer: l.Digest, Err: err}
	}
	defer closeR()
	a.seen = map[string]bool{}
	tr := tar.NewReader(r)
	var entries int
	for {
		if err := ctx.Err(); err != nil {
			return &BuildError{Layer: l.Digest, Err: err}
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return &BuildError{Layer: l.Digest, Err: fmt.Errorf("read tar: %w", err)}
		}
		if err := a.entry(hdr, tr); err != nil {
			return &BuildError{Layer: l.Digest, Path: hdr.Name, Err: err}
		}
		if entries++; entries%1000 == 0 {
			pos, _ := f.Seek(0, io.SeekCurrent)
			progress(Progress{Phase: PhaseExtract, Image: image, Layer: l.Digest, Bytes: pos, Total: l.Size})
		}
	}
	progress(Progress{Phase: PhaseExtract, Image: image, Layer: l.Digest, Bytes: l.Size, Total: l.Size, Done: true})
	return nil
}

// decompress sniffs gzip and zstd; anything else is read as a plain tar.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, func() { _ = zr.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %w", err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// cleanName checks a tar name and returns it relative to the root ("" for
// the root itself).
func cleanName(n string) (string, error) {
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: %q has a .. component", ErrUnsafePath, n)
		}
	}
	if strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("%w: %q has a NUL byte", ErrUnsafePath, n)
	}
	return strings.TrimPrefix(path.Clean("/"+n), "/"), nil
}

// resolveDir returns the host path of directory rel (slash-separated,
// relative to the root), following symlinks inside the tree and creating
// missing directories.
func (a *applier) resolveDir(rel string) (string, error) {
	var done []string
	todo := strings.Split(rel, "/")
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		host := filepath.Join(a.root, filepath.Join(append(done, c)...))
		fi, err := os.Lstat(host)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(host, 0o755); err != nil {
				return "", err
			}
			done = append(done, c)
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if hops++; hops > 40 {
				return "", fmt.Errorf("too many levels of symbolic links under %s", rel)
			}
			target, err := os.Readlink(host)
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(target, "/") {
				done = nil
			}
			todo = append(strings.Split(target, "/"), todo...)
		case fi.IsDir():
			done = append(done, c)
		default:
			return "", fmt.Errorf("%s is not a directory", "/"+path.Join(append(done, c)...))
		}
	}
	return filepath.Join(a.root, filepath.Join(done...)), nil
}

// hostPath is where entry rel goes: its parent resolved, its name not.
func (a *applier) hostPath(rel string) (string, error) {
	dir, base := path.Split(rel)
	d, err := a.resolveDir(dir)
	if err != nil {
		return "", err
	}
	return filepath.Join(d, base), nil
}

func (a *applier) markSeen(host string) {
	for p := host; p != a.root && len(p) > len(a.root); p = filepath.Dir(p) {
		a.seen[p] = true
	}
}

// entry applies one tar entry.
func (a *applier) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if rel == "" { // the root directory itself
		if hdr.Typeflag == tar.TypeDir {
			return a.meta(a.root, hdr)
		}
		return fmt.Errorf("%w: the root is not a directory", ErrUnsafePath)
	}
	dir, base := path.Split(rel)
	if base == ".wh..wh..opq" {
		host, err := a.resolveDir(dir)
		if err != nil {
			return err
		}
		return a.opaque(host)
	}
	if strings.HasPrefix(base, ".wh.") {
		host, err := a.hostPath(path.Join(dir, base[len(".wh."):]))
		if err != nil {
			return err
		}
		if err := os.RemoveAll(host); err != nil {
			return fmt.Errorf("whiteout: %w", err)
		}
		return nil
	}
	host, err := a.hostPath(rel)
	if err != nil {
		return err
	}
	if host == a.root {
		return fmt.Errorf("%w: %q resolves to the root", ErrUnsafePath, hdr.Name)
	}
	a.markSeen(host)
	if fi, err := os.Lstat(host); err == nil && !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
		if err := os.RemoveAll(host); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(host, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case tar.TypeReg: // tar.Reader turns the old TypeRegA into TypeReg or TypeDir
		if err := writeFile(host, r); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, host); err != nil {
			return err
		}
	case tar.TypeLink:
		return a.hardlink(host, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if !a.root0 {
			a.log.Warn("oci: device node skipped: creating it needs root", "path", hdr.Name)
			return nil
		}
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode |= unix.S_IFCHR
		case tar.TypeBlock:
			mode |= unix.S_IFBLK
		default:
			mode |= unix.S_IFIFO
		}
		if err := unix.Mknod(host, mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
	default:
		a.log.Warn("oci: tar entry of unsupported type skipped", "path", hdr.Name, "type", string(hdr.Typeflag))
		return nil
	}
	return a.meta(host, hdr)
}

func writeFile(host string, r io.Reader) error {
	f, err := os.OpenFile(host, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// hardlink links host to the tree's linkname (not following a final
// symlink: the link is to the symlink itself).
func (a *applier) hardlink(host, linkname string) error {
	trel, err := cleanName(linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	target, err := a.hostPath(trel)
	if err != nil {
		return fmt.Errorf("hard link target %s: %w", linkname, err)
	}
	fi, err := os.Lstat(target)
	if err != nil {
		return fmt.Errorf("hard link target %s: %w", linkname, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("hard link target %s is a directory", linkname)
	}
	return os.Link(target, host)
}

// opaque empties dir of what lower layers put there.
func (a *applier) opaque(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("opaque directory: %w", err)
	}
	a.markSeen(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if a.seen[p] {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("opaque directory: %w", err)
		}
	}
	return nil
}

// meta sets ownership, mode, xattrs and times of host from hdr.
func (a *applier) meta(host string, hdr *tar.Header) error {
	if err := os.Lchown(host, hdr.Uid, hdr.Gid); err != nil {
		if !a.root0 && hdr.Uid == os.Geteuid() && hdr.Gid == os.Getegid() {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("chown %d:%d (keeping ownership needs root): %w", hdr.Uid, hdr.Gid, err)
		}
	}
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			if err := unix.Lsetxattr(host, name, []byte(v), 0); err != nil {
				a.log.Warn("oci: extended attribute not kept", "path", hdr.Name, "xattr", name, "err", err)
			}
		}
	}
	if hdr.Typeflag == tar.TypeSymlink {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, host, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("times: %w", err)
		}
		return nil
	}
	mode := fs.FileMode(hdr.Mode).Perm()
	if hdr.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if hdr.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if err := os.Chmod(host, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if hdr.Typeflag == tar.TypeDir {
		a.dirTimes[host] = hdr.ModTime
		return nil
	}
	if err := os.Chtimes(host, hdr.ModTime, hdr.ModTime); err != nil {
		return fmt.Errorf("times: %w", err)
	}
	return nil
}

// statTree counts the tree's inodes and data blocks (hard links once).
func statTree(tree string) (treeStats, error) {
	var st treeStats
	seen := map[uint64]bool{}
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 && !fi.IsDir() {
			if seen[sys.Ino] {
				return nil
			}
			seen[sys.Ino] = true
		}
		st.inodes++
		switch {
		case fi.IsDir():
			st.blocks++
		case fi.Mode().IsRegular(), fi.Mode()&fs.ModeSymlink != 0:
			st.blocks += (fi.Size() + 4095) / 4096
		}
		return nil
	})
	if err != nil {
		return treeStats{}, &BuildError{Err: fmt.Errorf("size the tree: %w", err)}
	}
	return st, nil
}

// diskUsage is the space a file takes (sparse files count their blocks).
func diskUsage(fi fs.FileInfo) int64 {
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return fi.Size()
}
