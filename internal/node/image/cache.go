// Package image owns the node's content-addressed cache of base images (VM
// disks, kernels, initrds): fetching them over http(s) or from allowed local
// directories, verifying their SHA-256 while they stream in, and storing
// them as read-only blobs at Dir/sha256/<hex>. The cache never holds a blob
// whose bytes do not match its name.
//
// Inspect (inspect.go) is the one safety check of a disk image before a
// runtime uses it: qcow2 or raw only, no backing file, no external data file.
//
// It must not create overlays, convert formats or know about instances:
// runtimes take the verified blob path and build on top of it.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// DefaultMaxBytes bounds one blob when Options.MaxBytes is 0.
const DefaultMaxBytes int64 = 64 << 30

// maxRedirects is how many http(s) redirects one download follows.
const maxRedirects = 5

// Options configures a Cache.
type Options struct {
	// Dir is the cache root: blobs at Dir/sha256/<hex>, partial downloads
	// in Dir/tmp (same filesystem, so the final rename is atomic). One
	// Cache owns Dir: NewCache removes what Dir/tmp holds.
	Dir string
	// AllowedDirs are the only directories file URLs and local paths may
	// resolve into (after following symlinks). Empty: no local sources.
	AllowedDirs []string
	// HTTPClient fetches http(s) sources. Nil: a client with dial, TLS and
	// response-header timeouts but no overall timeout (ctx bounds it). The
	// cache uses a copy that stops after 5 redirects (before calling the
	// client's own CheckRedirect) and, unless AllowLocalURLs, dials through
	// the cache's own address check: its transport must then be nil or an
	// *http.Transport without a dial function of its own.
	HTTPClient *http.Client
	// AllowLocalURLs lets http(s) sources point at loopback (127.0.0.0/8,
	// ::1), link-local (169.254.0.0/16, fe80::/10) and unspecified (0.0.0.0/8,
	// ::) addresses. Off, such a URL is refused (ErrLocalURL): checked on
	// every address its host resolves to, on every redirect, and on the
	// address actually dialed, so DNS rebinding cannot slip past. The agent
	// sets it from NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS; tests serving images
	// from httptest on 127.0.0.1 need it.
	AllowLocalURLs bool
	// MaxBytes bounds one blob (0: DefaultMaxBytes).
	MaxBytes int64
	// Log receives one Info line per download (nil: slog.Default()).
	Log *slog.Logger
}

// Result describes a verified blob.
type Result struct {
	Path   string        // absolute path of the blob
	SHA256 string        // lowercase hex digest
	Bytes  int64         // blob size
	Cached bool          // true when no download was needed
	Took   time.Duration // time the call took
}

// Cache is a content-addressed blob cache. It is safe for concurrent use.
type Cache struct {
	dir        string
	blobDir    string
	tmpDir     string
	allowed    []string
	client     *http.Client
	allowLocal bool
	maxBytes   int64
	log        *slog.Logger

	mu      sync.Mutex
	flights map[string]*flight // by digest
}

// NewCache creates the cache directories (0o750) and returns the cache.
func NewCache(opts Options) (*Cache, error) {
	if opts.Dir == "" {
		return nil, errors.New("image: options: dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("image: options: dir %q: %w", opts.Dir, err)
	}
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("image: options: max_bytes %d is negative", opts.MaxBytes)
	}
	allowed := make([]string, 0, len(opts.AllowedDirs))
	for i, d := range opts.AllowedDirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("image: options: allowed_dirs[%d] %q is not absolute", i, d)
		}
		allowed = append(allowed, filepath.Clean(d))
	}
	client, err := httpClient(opts.HTTPClient, opts.AllowLocalURLs)
	if err != nil {
		return nil, err
	}
	c := &Cache{
		dir:        dir,
		blobDir:    filepath.Join(dir, "sha256"),
		tmpDir:     filepath.Join(dir, "tmp"),
		allowed:    allowed,
		client:     client,
		allowLocal: opts.AllowLocalURLs,
		maxBytes:   opts.MaxBytes,
		log:        opts.Log,
		flights:    map[string]*flight{},
	}
	if c.maxBytes == 0 {
		c.maxBytes = DefaultMaxBytes
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	for _, d := range []string{c.dir, c.blobDir, c.tmpDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("image: create cache dir: %w", err)
		}
	}
	if err := c.removePartials(); err != nil {
		return nil, err
	}
	return c, nil
}

// removePartials deletes what Dir/tmp holds when the cache opens: the
// partial downloads of a process that died mid-download (kill -9, a
// crash, power loss). One Cache owns Dir (the agent opens one per
// runtime dir), so nothing in tmp is in flight yet.
func (c *Cache) removePartials() error {
	ents, err := os.ReadDir(c.tmpDir)
	if err != nil {
		return fmt.Errorf("image: read %s: %w", c.tmpDir, err)
	}
	for _, e := range ents {
		p := filepath.Join(c.tmpDir, e.Name())
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("image: remove partial download: %w", err)
		}
		c.log.Info("image: removed a partial download left by an earlier run", "path", p)
	}
	return nil
}

// normDigest lowercases d and checks it is 64 hex characters.
func normDigest(d string) (string, error) {
	l := strings.ToLower(d)
	if len(l) != 64 {
		return "", fmt.Errorf("%w %q: want 64 hex characters, got %d", ErrBadDigest, d, len(d))
	}
	if _, err := hex.DecodeString(l); err != nil {
		return "", fmt.Errorf("%w %q: want 64 hex characters", ErrBadDigest, d)
	}
	return l, nil
}

func (c *Cache) blobPath(digest string) string { return filepath.Join(c.blobDir, digest) }

// AllowsLocalURLs reports Options.AllowLocalURLs (the OCI store of
// microVMs follows it for registries).
func (c *Cache) AllowsLocalURLs() bool { return c.allowLocal }

// Lookup returns the blob path for a cached digest without re-hashing it.
func (c *Cache) Lookup(sha256hex string) (path string, ok bool) {
	d, err := normDigest(sha256hex)
	if err != nil {
		return "", false
	}
	p := c.blobPath(d)
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	return p, true
}

// Fetch returns the verified local blob for src (an http, https or file
// URL, or an absolute local path), downloading it when the digest is not
// cached yet. The digest is required (ErrDigestRequired for plain http,
// ErrBadDigest otherwise); an http(s) URL may not reach a local address
// unless Options.AllowLocalURLs (ErrLocalURL). The digest is computed while the bytes stream into Dir/tmp,
// and the blob is renamed into place only if it matches. Concurrent
// Fetches of one digest download once, bounded by the ctx of the caller
// that started the download; a waiting caller whose ctx ends stops waiting,
// and when the starting caller's ctx ends the others retry with their own.
func (c *Cache) Fetch(ctx context.Context, src, sha256hex string) (Result, error) {
	start := time.Now()
	s, err := c.parseSource(src)
	if err != nil {
		return Result{}, err
	}
	if s.plainHTTP && sha256hex == "" {
		return Result{}, &FetchError{Stage: StageDigest, Source: s.display,
			Err: fmt.Errorf("%w: a plain http source is only fetched with its sha256", ErrDigestRequired)}
	}
	digest, err := normDigest(sha256hex)
	if err != nil {
		return Result{}, &FetchError{Stage: StageDigest, Source: s.display, Err: err}
	}
	if r, ok := c.cached(digest, start); ok {
		return r, nil
	}
	for {
		c.mu.Lock()
		f, running := c.flights[digest]
		if !running {
			// Lead the flight: download in this goroutine, so a partial
			// file is gone by the time this call returns.
			f = &flight{done: make(chan struct{})}
			c.flights[digest] = f
			c.mu.Unlock()
			f.res, f.err = c.fetchOnce(ctx, s, digest, start)
			c.mu.Lock()
			delete(c.flights, digest)
			c.mu.Unlock()
			close(f.done)
			return f.res, f.err
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return Result{}, &FetchError{Stage: StageDownload, Source: s.display, Err: ctx.Err()}
		case <-f.done:
			// The caller that led the flight gave up; this one still waits.
			if isCtxErr(f.err) && ctx.Err() == nil {
				continue
			}
			if f.err != nil {
				return Result{}, f.err
			}
			r := f.res
			r.Took = time.Since(start)
			return r, nil
		}
	}
}

// flight is one download that concurrent Fetches of a digest share.
type flight struct {
	done chan struct{} // closed when res and err are set
	res  Result
	err  error
}

// fetchOnce downloads digest unless another flight stored it meanwhile.
func (c *Cache) fetchOnce(ctx context.Context, s source, digest string, start time.Time) (Result, error) {
	if r, ok := c.cached(digest, start); ok {
		return r, nil
	}
	return c.download(ctx, s, digest, start)
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// cached returns the Result for a blob already in the cache.
func (c *Cache) cached(digest string, start time.Time) (Result, bool) {
	p := c.blobPath(digest)
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return Result{}, false
	}
	return Result{Path: p, SHA256: digest, Bytes: fi.Size(), Cached: true, Took: time.Since(start)}, true
}

// download streams s into Dir/tmp while hashing it, and renames the file
// into place if its digest matches. The partial file never outlives it.
func (c *Cache) download(ctx context.Context, s source, digest string, start time.Time) (res Result, err error) {
	rc, size, err := c.open(ctx, s)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = rc.Close() }()
	if size > c.maxBytes {
		return Result{}, &FetchError{Stage: StageDownload, Source: s.display,
			Err: fmt.Errorf("%w: size %d bytes exceeds limit of %d", ErrTooLarge, size, c.maxBytes)}
	}

	tmp, err := os.CreateTemp(c.tmpDir, digest+"-*.part")
	if err != nil {
		return Result{}, &FetchError{Stage: StageStore, Source: s.display, Err: err}
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()

	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(storeWriter{tmp}, h), &limitedReader{ctx: ctx, r: rc, left: c.maxBytes})
	if err != nil {
		stage := StageDownload
		var we *writeError
		if errors.As(err, &we) {
			stage = StageStore
		}
		if errors.Is(err, ErrTooLarge) {
			err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, c.maxBytes)
		}
		return Result{}, &FetchError{Stage: stage, Source: s.display, Err: err}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		err = &mismatchError{got: got, want: digest}
		return Result{}, &FetchError{Stage: StageDigest, Source: s.display, Err: err}
	}
	if err = tmp.Sync(); err == nil {
		err = tmp.Chmod(0o440)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), c.blobPath(digest))
	}
	if err != nil {
		return Result{}, &FetchError{Stage: StageStore, Source: s.display, Err: err}
	}
	syncDir(c.blobDir)

	took := time.Since(start)
	c.log.Info("image downloaded", "source", s.display, "sha256", digest, "bytes", n,
		"duration", took.Round(time.Millisecond))
	return Result{Path: c.blobPath(digest), SHA256: digest, Bytes: n, Took: took}, nil
}

// syncDir makes a rename durable where the OS supports syncing a
// directory; where it does not (Windows) the rename is still atomic.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	_ = d.Close()
}

// Verify re-hashes a cached blob. A blob that no longer matches its name is
// removed (so the next Fetch downloads it again) and reported as
// ErrDigestMismatch; a missing one is ErrNotCached.
func (c *Cache) Verify(ctx context.Context, sha256hex string) (Result, error) {
	start := time.Now()
	digest, err := normDigest(sha256hex)
	if err != nil {
		return Result{}, &FetchError{Stage: StageDigest, Source: sha256hex, Err: err}
	}
	p := c.blobPath(digest)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %w", ErrNotCached, err)
		}
		return Result{}, &FetchError{Stage: StageStore, Source: p, Err: err}
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	n, err := io.Copy(h, &limitedReader{ctx: ctx, r: f, left: -1})
	if err != nil {
		return Result{}, &FetchError{Stage: StageStore, Source: p, Err: err}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		if rerr := os.Remove(p); rerr != nil {
			c.log.Warn("image: remove corrupted blob", "path", p, "err", rerr)
		} else {
			c.log.Warn("image: removed corrupted blob", "path", p, "got", got)
		}
		return Result{}, &FetchError{Stage: StageDigest, Source: p, Err: &mismatchError{got: got, want: digest}}
	}
	return Result{Path: p, SHA256: digest, Bytes: n, Cached: true, Took: time.Since(start)}, nil
}

// limitedReader stops at ctx's end and when more than left bytes come
// (left < 0: no limit).
type limitedReader struct {
	ctx  context.Context
	r    io.Reader
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if err := l.ctx.Err(); err != nil {
		return 0, err
	}
	if l.left >= 0 && int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	if l.left >= 0 {
		l.left -= int64(n)
		if l.left < 0 {
			return n, ErrTooLarge
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		if cerr := l.ctx.Err(); cerr != nil {
			err = cerr
		}
	}
	return n, err
}

// writeError marks a failure to write the partial file, so it is reported
// as a store (not download) failure.
type writeError struct{ err error }

func (w *writeError) Error() string { return w.err.Error() }
func (w *writeError) Unwrap() error { return w.err }

type storeWriter struct{ w io.Writer }

func (s storeWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err != nil {
		return n, &writeError{err: err}
	}
	return n, nil
}
