package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"
)

// Rootfs is a built root filesystem.
type Rootfs struct {
	Path       string // rootfs/<hex>.ext4: read-only, boot an overlay or copy of it
	ConfigPath string // rootfs/<hex>.json: the image's ImageConfig
	Digest     string // the image's manifest digest
	Bytes      int64  // disk space the ext4 file takes
	Cached     bool   // it was built before
}

// Rootfs returns the ext4 root filesystem of the pulled image with
// manifest digest, building it when it is not cached: the layers applied
// in order to a tree in tmp (see the package comment of extract), then
// mkfs.ext4 -d. It is built into tmp and renamed into place with its
// config, so a crash leaves no half-built filesystem under rootfs/. Every
// failure is a *runtime.Error with reason rootfs_build_failed; a
// *BuildError inside names the layer and path.
func (s *Store) Rootfs(ctx context.Context, digest string, progress ProgressFunc) (Rootfs, error) {
	start := time.Now()
	if progress == nil {
		progress = func(Progress) {}
	}
	d, err := normDigest(digest)
	if err != nil {
		return Rootfs{}, buildError(digest, err)
	}
	unlock, err := s.locks.lock(ctx, d)
	if err != nil {
		return Rootfs{}, buildError(d, err)
	}
	defer unlock()
	s.mu.Lock()
	rec := s.idx.Images[d]
	var layers []Layer
	var cfg ImageConfig
	if rec != nil { // held in the same critical section, so Prune cannot slip in between
		layers, cfg = append([]Layer(nil), rec.Layers...), rec.Config
		held := []string{d}
		for _, l := range layers {
			held = append(held, l.Digest)
		}
		defer s.holdLocked(held...)()
	}
	s.mu.Unlock()
	if rec == nil {
		return Rootfs{}, buildError(d, ErrNotPulled)
	}

	out := Rootfs{Path: s.RootfsPath(d), ConfigPath: s.ConfigPath(d), Digest: d}
	if fi, err := os.Stat(out.Path); err == nil && fi.Mode().IsRegular() {
		if _, err := os.Stat(out.ConfigPath); err == nil {
			out.Bytes, out.Cached = diskUsage(fi), true
			s.touch(d, out.Bytes)
			progress(Progress{Phase: PhaseRootfs, Image: d, Bytes: out.Bytes, Total: out.Bytes, Done: true, Cached: true})
			return out, nil
		}
	}

	work, err := os.MkdirTemp(s.tmpDir, strings.TrimPrefix(d, "sha256:")+"-*")
	if err != nil {
		return Rootfs{}, buildError(d, &BuildError{Err: err})
	}
	defer func() { _ = os.RemoveAll(work) }()
	tree := filepath.Join(work, "tree")
	paths := make([]string, len(layers))
	for i, l := range layers {
		paths[i] = s.blobPath(l.Digest)
	}
	st, err := extractLayers(ctx, tree, layers, paths, d, progress, s.log)
	if err != nil {
		return Rootfs{}, buildError(d, err)
	}
	progress(Progress{Phase: PhaseRootfs, Image: d, Total: st.imageBytes()})
	img := filepath.Join(work, "rootfs.ext4")
	if err := s.makeFS(ctx, tree, img, st); err != nil {
		return Rootfs{}, buildError(d, &BuildError{Err: err})
	}
	cj, err := json.MarshalIndent(cfg, "", "  ")
	if err == nil {
		err = atomicfile.Write(out.ConfigPath, cj, 0o640)
	}
	if err == nil {
		err = os.Chmod(img, 0o440)
	}
	if err == nil {
		err = os.Rename(img, out.Path)
	}
	if err == nil {
		err = atomicfile.SyncDir(s.rootfsDir)
	}
	if err != nil {
		return Rootfs{}, buildError(d, &BuildError{Path: out.Path, Err: err})
	}
	fi, err := os.Stat(out.Path)
	if err != nil {
		return Rootfs{}, buildError(d, &BuildError{Path: out.Path, Err: err})
	}
	out.Bytes = diskUsage(fi)
	s.touch(d, out.Bytes)
	progress(Progress{Phase: PhaseRootfs, Image: d, Bytes: out.Bytes, Total: out.Bytes, Done: true})
	s.log.Info("oci rootfs built", "digest", d, "path", out.Path, "files", st.inodes, "bytes", out.Bytes,
		"duration", time.Since(start).Round(time.Millisecond))
	if _, err := s.Prune(); err != nil {
		s.log.Warn("oci: prune", "err", err)
	}
	return out, nil
}

// touch records the rootfs size and a use of image d.
func (s *Store) touch(d string, rootfsBytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec := s.idx.Images[d]; rec != nil {
		rec.RootfsBytes, rec.LastUsed = rootfsBytes, s.now().UTC()
		if err := s.saveLocked(); err != nil {
			s.log.Warn("oci: record rootfs", "err", err)
		}
	}
}

// Prepare is what a runtime calls to boot an instance from an OCI image:
// Pull, then a lease for holder (the instance id), then Rootfs. The lease
// stays on failure of the build too; the runtime releases it when it
// destroys the instance.
func (s *Store) Prepare(ctx context.Context, holder, ref, digest string, auth []byte, progress ProgressFunc) (*Image, Rootfs, error) {
	img, err := s.Pull(ctx, ref, digest, auth, progress)
	if err != nil {
		return nil, Rootfs{}, err
	}
	err = s.Acquire(holder, img.Digest)
	if errors.Is(err, ErrNotPulled) { // evicted between the two: once more, now pinned
		if img, err = s.Pull(ctx, ref, img.Digest, auth, progress); err != nil {
			return nil, Rootfs{}, err
		}
		err = s.Acquire(holder, img.Digest)
	}
	if err != nil {
		return img, Rootfs{}, buildError(img.Digest, err)
	}
	rfs, err := s.Rootfs(ctx, img.Digest, progress)
	return img, rfs, err
}

// treeStats sizes the filesystem mkfs writes.
type treeStats struct {
	inodes int64 // files, dirs, links (hard links once)
	blocks int64 // 4 KiB blocks of file and directory data
}

// imageBytes is the tree plus headroom: a quarter more, 64 MiB for the
// journal and metadata, and 256 bytes of inode table per inode (with the
// inode headroom mkfs gets), rounded up to a MiB.
func (t treeStats) imageBytes() int64 {
	b := t.blocks * 4096
	b += b/4 + 64<<20 + t.inodeCount()*256
	return (b + 1<<20 - 1) &^ (1<<20 - 1)
}

func (t treeStats) inodeCount() int64 { return t.inodes + t.inodes/4 + 4096 }

// makeFS writes tree as an ext4 filesystem to img, labelled rootfs.
func (s *Store) makeFS(ctx context.Context, tree, img string, st treeStats) error {
	size := st.imageBytes()
	args := []string{"-q", "-F", "-b", "4096", "-m", "0", "-N", strconv.FormatInt(st.inodeCount(), 10),
		"-L", "rootfs", "-E", "root_owner=0:0", "-d", tree, img, strconv.FormatInt(size>>10, 10) + "k"}
	cmd := exec.CommandContext(ctx, s.mkfs, args...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w (install e2fsprogs)", s.mkfs, err)
		}
		return fmt.Errorf("%s %s: %w: %s", s.mkfs, strings.Join(args, " "), err, tail(b))
	}
	return nil
}

// tail is the last 1 KiB of command output, trimmed.
func tail(b []byte) string {
	if len(b) > 1024 {
		b = b[len(b)-1024:]
	}
	return strings.TrimSpace(string(b))
}
