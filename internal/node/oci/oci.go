// Package oci owns the node's OCI images for microVMs: pulling them from a
// registry (go-containerregistry) by tag or digest, with credentials from
// a secret, into a content-addressed cache under the agent's runtime dir;
// building one ext4 root filesystem per image digest from the layers
// (whiteouts and opaque directories applied, ownership, modes and times
// kept, mkfs.ext4 -d, no mount); bounding the cache's size by evicting the
// least recently used images that no instance holds (leases persisted in
// the cache's index, so an agent restart keeps them); and the per-instance
// copy-on-write helpers (a qcow2 overlay for QEMU, a reflink or sparse copy
// for Firecracker).
//
// Layout under Options.Dir:
//
//	index.json             images (config, layers, last use) and leases
//	blobs/sha256/<hex>     layer blobs as the registry serves them (read-only)
//	rootfs/<hex>.ext4      the root filesystem of manifest <hex> (read-only)
//	rootfs/<hex>.json      its image config (ImageConfig) for the guest init
//	tmp/                   partial blobs and trees being built
//
// Pull failures are *runtime.Error with reason image_pull_failed (the
// registry's own message kept); build failures rootfs_build_failed, their
// *BuildError naming the layer and the path. It must not start, network
// or know the state of instances: runtimes lease an image for an instance
// id and boot their own overlay of the rootfs.
package oci

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// DefaultMaxBytes bounds the cache when Options.MaxBytes is 0.
const DefaultMaxBytes int64 = 20 << 30

// Phases a Progress names.
const (
	PhasePull    = "pull"    // a layer blob downloading (or found cached)
	PhaseExtract = "extract" // a layer applied to the tree
	PhaseRootfs  = "rootfs"  // mkfs.ext4 writing the root filesystem
)

// Progress is one step of a pull or build, for the agent's events.
type Progress struct {
	Phase  string // PhasePull, PhaseExtract or PhaseRootfs
	Image  string // the image's reference (pull) or manifest digest
	Layer  string // layer digest (pull, extract)
	Bytes  int64  // bytes done so far (pull: downloaded; extract: read)
	Total  int64  // bytes in all (0 when unknown)
	Done   bool   // the step finished
	Cached bool   // nothing to do: the blob or rootfs was cached
}

// ProgressFunc receives Progress; it must not block for long.
type ProgressFunc func(Progress)

// Options configures a Store.
type Options struct {
	// Dir is the cache root (the agent: <runtime dir>/oci).
	Dir string
	// MaxBytes bounds blobs plus root filesystems (0: DefaultMaxBytes).
	// Past it, images no lease holds are evicted, least recently used
	// first; leased ones are kept even if the bound is then exceeded.
	MaxBytes int64
	// AllowLocalURLs lets registries on loopback, link-local and
	// unspecified addresses be pulled from (NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS;
	// tests need it). Off, they are refused as image URLs are.
	AllowLocalURLs bool
	// HTTPClient's transport carries registry requests (nil: the image
	// cache's default); the image cache's address guard wraps it.
	HTTPClient *http.Client
	// MkfsExt4 is the mkfs.ext4 binary (default "mkfs.ext4").
	MkfsExt4 string
	// Log receives one Info line per pull, build and eviction (nil:
	// slog.Default()).
	Log *slog.Logger
	// Now is the clock of last-use times (nil: time.Now).
	Now func() time.Time
}

// Store is the OCI image cache. It is safe for concurrent use within one
// process; one Store owns its Dir.
type Store struct {
	dir, blobDir, rootfsDir, tmpDir string
	maxBytes                        int64
	allowLocal                      bool
	client                          *http.Client
	mkfs                            string
	log                             *slog.Logger
	now                             func() time.Time

	locks keyed // per image digest: one pull or build at a time

	mu   sync.Mutex
	idx  *index
	busy map[string]int // image and blob digests a pull or build uses now
}

// MaxBytes is the cache's bound (Options.MaxBytes, defaulted).
func (s *Store) MaxBytes() int64 { return s.maxBytes }

// New creates the cache directories (0o750), loads the index and removes
// partial files an interrupted pull or build left in tmp.
func New(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("oci: options: dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("oci: options: dir %q: %w", opts.Dir, err)
	}
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("oci: options: max_bytes %d is negative", opts.MaxBytes)
	}
	client, err := image.GuardedClient(opts.HTTPClient, opts.AllowLocalURLs)
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	s := &Store{
		dir: dir, blobDir: filepath.Join(dir, "blobs", "sha256"), rootfsDir: filepath.Join(dir, "rootfs"),
		tmpDir: filepath.Join(dir, "tmp"), maxBytes: opts.MaxBytes, allowLocal: opts.AllowLocalURLs,
		client: client, mkfs: opts.MkfsExt4, log: opts.Log, now: opts.Now, busy: map[string]int{},
	}
	if s.maxBytes == 0 {
		s.maxBytes = DefaultMaxBytes
	}
	if s.mkfs == "" {
		s.mkfs = "mkfs.ext4"
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if err := os.RemoveAll(s.tmpDir); err != nil {
		return nil, fmt.Errorf("oci: clear tmp: %w", err)
	}
	for _, d := range []string{s.dir, s.blobDir, s.rootfsDir, s.tmpDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("oci: create cache dir: %w", err)
		}
	}
	if s.idx, err = loadIndex(s.indexPath()); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) indexPath() string { return filepath.Join(s.dir, "index.json") }

// blobPath is where a blob (sha256:<hex>) is kept.
func (s *Store) blobPath(digest string) string {
	return filepath.Join(s.blobDir, strings.TrimPrefix(digest, "sha256:"))
}

// RootfsPath is where the root filesystem of manifest digest is kept
// (whether or not it is built yet).
func (s *Store) RootfsPath(digest string) string {
	return filepath.Join(s.rootfsDir, strings.TrimPrefix(digest, "sha256:")+".ext4")
}

// ConfigPath is where the image config of manifest digest is written
// beside its root filesystem.
func (s *Store) ConfigPath(digest string) string {
	return filepath.Join(s.rootfsDir, strings.TrimPrefix(digest, "sha256:")+".json")
}

// pullError is a *runtime.Error with reason image_pull_failed.
func pullError(ref string, err error) error {
	return &runtime.Error{Reason: api.ReasonImagePullFailed, Op: "pull", ID: ref, Err: err}
}

// BuildError is why a root filesystem could not be built: the layer
// (digest) being applied and the path in it, when the failure has one.
type BuildError struct {
	Layer string
	Path  string
	Err   error
}

func (e *BuildError) Error() string {
	var b strings.Builder
	if e.Layer != "" {
		b.WriteString("layer " + e.Layer + ": ")
	}
	if e.Path != "" {
		b.WriteString("path " + e.Path + ": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *BuildError) Unwrap() error { return e.Err }

// buildError is a *runtime.Error with reason rootfs_build_failed.
func buildError(digest string, err error) error {
	return &runtime.Error{Reason: api.ReasonRootfsBuildFailed, Op: "rootfs", ID: digest, Err: err}
}

// Sentinel errors, found wrapped inside the *runtime.Error; branch with
// errors.Is.
var (
	// ErrDigestMismatch: the reference resolved to another digest than the
	// one pinned, or a blob's bytes do not hash to its digest.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrUnsafePath: a layer entry's path (or a hard link's target)
	// leaves the root filesystem.
	ErrUnsafePath = errors.New("path escapes the root filesystem")
	// ErrNotPulled: the image is not in the cache.
	ErrNotPulled = errors.New("image not pulled")
)

// keyed serialises work per key; lock honours ctx while waiting.
type keyed struct {
	mu sync.Mutex
	m  map[string]*keyLock
}

type keyLock struct {
	ch chan struct{}
	n  int
}

func (k *keyed) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.n++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if l.n--; l.n == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
