package oci

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"
)

// index is index.json: what the cache holds and who holds what.
type index struct {
	Images map[string]*record `json:"images"` // by manifest digest
	Leases map[string]string  `json:"leases"` // holder (instance id) → manifest digest
}

// record is one pulled image.
type record struct {
	Ref         string      `json:"ref"`
	Digest      string      `json:"digest"`             // manifest digest
	Resolved    string      `json:"resolved,omitempty"` // what Ref resolved to (an index's digest, or Digest)
	Config      ImageConfig `json:"config"`
	Layers      []Layer     `json:"layers"`
	RootfsBytes int64       `json:"rootfs_bytes,omitempty"` // disk used by rootfs/<hex>.ext4; 0: not built
	LastUsed    time.Time   `json:"last_used"`
}

func loadIndex(path string) (*index, error) {
	idx := &index{Images: map[string]*record{}, Leases: map[string]string{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return idx, nil
	}
	if err != nil {
		return nil, fmt.Errorf("oci: read index: %w", err)
	}
	if err := json.Unmarshal(b, idx); err != nil {
		return nil, fmt.Errorf("oci: index %s: %w", path, err)
	}
	if idx.Images == nil {
		idx.Images = map[string]*record{}
	}
	if idx.Leases == nil {
		idx.Leases = map[string]string{}
	}
	return idx, nil
}

// saveLocked writes the index atomically; s.mu is held.
func (s *Store) saveLocked() error {
	b, err := json.MarshalIndent(s.idx, "", "  ")
	if err != nil {
		return fmt.Errorf("oci: encode index: %w", err)
	}
	if err := atomicfile.Write(s.indexPath(), b, 0o640); err != nil {
		return fmt.Errorf("oci: write index: %w", err)
	}
	return nil
}

// Acquire records that holder (an instance id) uses the image with
// manifest digest, replacing the holder's previous lease: while it holds
// it, neither the image's blobs nor its root filesystem are evicted. The
// lease is persisted (index.json) and outlives an agent restart.
func (s *Store) Acquire(holder, digest string) error {
	if holder == "" {
		return errors.New("oci: acquire: empty holder")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.idx.Images[digest]
	if !ok {
		return fmt.Errorf("oci: acquire %s for %s: %w", digest, holder, ErrNotPulled)
	}
	rec.LastUsed = s.now().UTC()
	s.idx.Leases[holder] = digest
	return s.saveLocked()
}

// Release drops holder's lease (none: no-op). The image is kept until the
// cache's bound evicts it.
func (s *Store) Release(holder string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	digest, ok := s.idx.Leases[holder]
	if !ok {
		return nil
	}
	delete(s.idx.Leases, holder)
	if rec := s.idx.Images[digest]; rec != nil {
		rec.LastUsed = s.now().UTC()
	}
	return s.saveLocked()
}

// Leases returns a copy of the leases: holder → manifest digest. The agent
// compares it with its instances after a restart and releases the
// leases of instances that are gone.
func (s *Store) Leases() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]string, len(s.idx.Leases))
	for k, v := range s.idx.Leases {
		m[k] = v
	}
	return m
}

// Usage is the cache's size accounting.
type Usage struct {
	Bytes    int64    // unique blobs plus root filesystems
	MaxBytes int64    // the bound
	Images   []string // manifest digests, most recently used first
}

// Usage reports the bytes the cache holds.
func (s *Store) Usage() Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := Usage{Bytes: s.usageLocked(), MaxBytes: s.maxBytes}
	for _, r := range s.lruLocked() {
		u.Images = append([]string{r.Digest}, u.Images...)
	}
	return u
}

func (s *Store) usageLocked() int64 {
	var n int64
	seen := map[string]bool{}
	for _, r := range s.idx.Images {
		n += r.RootfsBytes
		for _, l := range r.Layers {
			if !seen[l.Digest] {
				seen[l.Digest] = true
				n += l.Size
			}
		}
	}
	return n
}

// lruLocked lists the records least recently used first.
func (s *Store) lruLocked() []*record {
	recs := make([]*record, 0, len(s.idx.Images))
	for _, r := range s.idx.Images {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool {
		if !recs[i].LastUsed.Equal(recs[j].LastUsed) {
			return recs[i].LastUsed.Before(recs[j].LastUsed)
		}
		return recs[i].Digest < recs[j].Digest
	})
	return recs
}

// Prune evicts images, least recently used first, until the cache is
// within its bound; images a lease holds or a pull or build is using are
// kept. It returns the manifest digests evicted. Pull and Rootfs call it
// after they add to the cache.
func (s *Store) Prune() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pruneLocked()
}

func (s *Store) pruneLocked() ([]string, error) {
	used := s.usageLocked()
	if used <= s.maxBytes {
		return nil, nil
	}
	leased := map[string]bool{}
	for _, d := range s.idx.Leases {
		leased[d] = true
	}
	var evicted []string
	var errs []error
	for _, r := range s.lruLocked() {
		if used <= s.maxBytes {
			break
		}
		if leased[r.Digest] || s.busy[r.Digest] > 0 {
			continue
		}
		freed, err := s.evictLocked(r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		used -= freed
		evicted = append(evicted, r.Digest)
		s.log.Info("oci image evicted", "image", r.Ref, "digest", r.Digest, "freed_bytes", freed,
			"cache_bytes", used, "max_bytes", s.maxBytes)
	}
	if len(evicted) > 0 {
		if err := s.saveLocked(); err != nil {
			errs = append(errs, err)
		}
	}
	if used > s.maxBytes {
		s.log.Warn("oci cache over its bound: the rest is in use", "cache_bytes", used, "max_bytes", s.maxBytes)
	}
	return evicted, errors.Join(errs...)
}

// evictLocked removes r's root filesystem, its config and the blobs no
// other image (or running pull) uses, and drops r from the index.
func (s *Store) evictLocked(r *record) (int64, error) {
	var freed int64
	for _, p := range []string{s.RootfsPath(r.Digest), s.ConfigPath(r.Digest)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("oci: evict %s: %w", r.Digest, err)
		}
	}
	freed += r.RootfsBytes
	r.RootfsBytes = 0
	for _, l := range r.Layers {
		if s.busy[l.Digest] > 0 || s.blobSharedLocked(r.Digest, l.Digest) {
			continue
		}
		if err := os.Remove(s.blobPath(l.Digest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return freed, fmt.Errorf("oci: evict %s: %w", r.Digest, err)
		}
		freed += l.Size
	}
	delete(s.idx.Images, r.Digest)
	return freed, nil
}

// blobSharedLocked reports whether an image other than digest has blob.
func (s *Store) blobSharedLocked(digest, blob string) bool {
	for d, o := range s.idx.Images {
		if d != digest && slices.ContainsFunc(o.Layers, func(l Layer) bool { return l.Digest == blob }) {
			return true
		}
	}
	return false
}

// hold marks digests busy (a pull or build uses them) until the returned
// func is called: Prune keeps them.
func (s *Store) hold(digests ...string) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holdLocked(digests...)
}

// holdLocked is hold with s.mu held; the returned func takes s.mu.
func (s *Store) holdLocked(digests ...string) func() {
	for _, d := range digests {
		s.busy[d]++
	}
	return func() {
		s.mu.Lock()
		for _, d := range digests {
			if s.busy[d]--; s.busy[d] <= 0 {
				delete(s.busy, d)
			}
		}
		s.mu.Unlock()
	}
}

// normDigest accepts sha256:<64 hex> or bare hex and returns sha256:<hex>.
func normDigest(d string) (string, error) {
	h := strings.ToLower(strings.TrimPrefix(d, "sha256:"))
	if len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", fmt.Errorf("digest %q: want sha256:<64 hex characters>", d)
	}
	return "sha256:" + h, nil
}
