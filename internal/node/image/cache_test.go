package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func newTestCache(t *testing.T, opts Options) *Cache {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = filepath.Join(t.TempDir(), "cache")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	c, err := NewCache(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// assertNoPartials fails if Dir/tmp holds anything.
func assertNoPartials(t *testing.T, c *Cache) {
	t.Helper()
	left, err := os.ReadDir(c.tmpDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("partial files left in %s: %v", c.tmpDir, left)
	}
}

// testServer serves content at /ok and a few failure modes, counting
// requests per path.
type testServer struct {
	*httptest.Server
	content []byte
	mu      sync.Mutex
	hits    map[string]int
}

func newTestServer(t *testing.T, content []byte) *testServer {
	ts := &testServer{content: content, hits: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		_, _ = w.Write(content)
	})
	mux.HandleFunc("/redirect/{n}", func(w http.ResponseWriter, r *http.Request) {
		var n int
		_, _ = fmt.Sscan(r.PathValue("n"), &n)
		if n == 0 {
			http.Redirect(w, r, "/ok", http.StatusFound)
			return
		}
		http.Redirect(w, r, fmt.Sprintf("/redirect/%d", n-1), http.StatusFound)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		_, _ = w.Write(content[:1])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, _ *http.Request) {
		for i := range content { // no Content-Length: chunked
			_, _ = w.Write(content[i : i+1])
			w.(http.Flusher).Flush()
		}
	})
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.mu.Lock()
		ts.hits[r.URL.Path]++
		ts.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func (ts *testServer) total() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	n := 0
	for _, v := range ts.hits {
		n += v
	}
	return n
}

func TestFetchHTTP(t *testing.T) {
	content := bytes.Repeat([]byte("drover image "), 1000)
	good := digestOf(content)
	ts := newTestServer(t, content)
	tests := []struct {
		name     string
		path     string
		digest   string
		maxBytes int64
		timeout  time.Duration
		wantErr  string // exact message, %s = server URL; empty: success
		wantIs   error
		stage    string
	}{
		{name: "ok", path: "/ok", digest: good},
		{name: "uppercase digest", path: "/ok", digest: strings.ToUpper(good)},
		{name: "redirects within limit", path: "/redirect/4", digest: good},
		{name: "chunked", path: "/stream", digest: good},
		{name: "not found", path: "/missing", digest: good, stage: StageDownload,
			wantErr: "image: download %s/missing: HTTP 404 Not Found"},
		{name: "too many redirects", path: "/redirect/9", digest: good, stage: StageDownload,
			wantErr: "image: download %s/redirect/9: stopped after 5 redirects"},
		{name: "wrong digest", path: "/ok", digest: strings.Repeat("ab", 32), stage: StageDigest, wantIs: ErrDigestMismatch,
			wantErr: "image: digest mismatch for %s/ok: got " + good + ", want " + strings.Repeat("ab", 32)},
		{name: "bad digest", path: "/ok", digest: "abc", stage: StageDigest, wantIs: ErrBadDigest},
		{name: "non-hex digest", path: "/ok", digest: strings.Repeat("zz", 32), stage: StageDigest, wantIs: ErrBadDigest},
		{name: "too large by content-length", path: "/ok", digest: good, maxBytes: 100, stage: StageDownload, wantIs: ErrTooLarge,
			wantErr: fmt.Sprintf("image: download %%s/ok: too large: size %d bytes exceeds limit of 100", len(content))},
		{name: "too large streamed", path: "/stream", digest: good, maxBytes: 100, stage: StageDownload, wantIs: ErrTooLarge,
			wantErr: "image: download %s/stream: too large: more than 100 bytes"},
		{name: "slow then ctx deadline", path: "/slow", digest: good, timeout: 200 * time.Millisecond,
			stage: StageDownload, wantIs: context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCache(t, Options{MaxBytes: tt.maxBytes, AllowLocalURLs: true})
			ctx := t.Context()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			res, err := c.Fetch(ctx, ts.URL+tt.path, tt.digest)
			assertNoPartials(t, c)
			if tt.stage == "" {
				if err != nil {
					t.Fatalf("Fetch() = %v", err)
				}
				if res.Cached || res.Bytes != int64(len(content)) || res.SHA256 != good {
					t.Errorf("Fetch() = %+v", res)
				}
				b, err := os.ReadFile(res.Path)
				if err != nil || !bytes.Equal(b, content) {
					t.Errorf("blob %s does not hold the content (err %v)", res.Path, err)
				}
				if res.Path != filepath.Join(c.dir, "sha256", good) {
					t.Errorf("Path = %s", res.Path)
				}
				return
			}
			var fe *FetchError
			if !errors.As(err, &fe) || fe.Stage != tt.stage {
				t.Fatalf("Fetch() = %#v (%v), want *FetchError stage %q", err, err, tt.stage)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("Fetch() = %v, want errors.Is %v", err, tt.wantIs)
			}
			if tt.wantErr != "" {
				if want := fmt.Sprintf(tt.wantErr, ts.URL); err.Error() != want {
					t.Errorf("error = %q\nwant    %q", err, want)
				}
			}
			if _, ok := c.Lookup(good); ok {
				t.Error("a failed fetch left a blob in the cache")
			}
		})
	}
}

func TestFetchCachedDoesNoRequest(t *testing.T) {
	content := []byte("kernel bytes")
	ts := newTestServer(t, content)
	var logs bytes.Buffer
	c := newTestCache(t, Options{Log: slog.New(slog.NewTextHandler(&logs, nil)), AllowLocalURLs: true})
	first, err := c.Fetch(t.Context(), ts.URL+"/ok", digestOf(content))
	if err != nil {
		t.Fatal(err)
	}
	// A different URL with the same digest is the same blob.
	second, err := c.Fetch(t.Context(), ts.URL+"/elsewhere", strings.ToUpper(digestOf(content)))
	if err != nil {
		t.Fatal(err)
	}
	if first.Cached || !second.Cached || first.Path != second.Path || second.Bytes != int64(len(content)) {
		t.Errorf("first %+v, second %+v", first, second)
	}
	if n := ts.total(); n != 1 {
		t.Errorf("server saw %d requests, want 1", n)
	}
	if p, ok := c.Lookup(digestOf(content)); !ok || p != first.Path {
		t.Errorf("Lookup = %q, %v", p, ok)
	}
	if fi, err := os.Stat(first.Path); err != nil || fi.Mode().Perm() != 0o440 {
		t.Errorf("blob mode: %v, %v", fi, err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=INFO") ||
		!strings.Contains(lines[0], fmt.Sprintf("bytes=%d", len(content))) || !strings.Contains(lines[0], "duration=") {
		t.Errorf("want one Info line with bytes and duration, got:\n%s", logs.String())
	}
}

func TestFetchConcurrentDownloadsOnce(t *testing.T) {
	content := bytes.Repeat([]byte{7}, 64<<10)
	var hits atomic.Int32
	arrived := make(chan struct{})
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			close(arrived)
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write(content)
	}))
	defer srv.Close()
	c := newTestCache(t, Options{AllowLocalURLs: true})

	const n = 8
	var wg sync.WaitGroup
	results := make([]Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { results[i], errs[i] = c.Fetch(t.Context(), srv.URL+"/img", digestOf(content)) })
	}
	<-arrived
	time.Sleep(100 * time.Millisecond) // let the others join the flight (or fail to)
	close(release)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("fetch %d: %v", i, errs[i])
		}
		if results[i].Path != results[0].Path {
			t.Errorf("fetch %d path %s != %s", i, results[i].Path, results[0].Path)
		}
	}
	if got := hits.Load(); got != 1 {
		t.Errorf("server saw %d requests, want 1", got)
	}
}

// A waiter whose ctx is fine must not inherit the cancellation of the
// caller that started the shared download.
func TestFetchLeaderCanceledFollowerSucceeds(t *testing.T) {
	content := []byte("shared blob")
	var hits atomic.Int32
	first := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			close(first)
			<-r.Context().Done()
			return
		}
		_, _ = w.Write(content)
	}))
	defer srv.Close()
	c := newTestCache(t, Options{AllowLocalURLs: true})

	leaderCtx, cancel := context.WithCancel(t.Context())
	leaderErr := make(chan error, 1)
	go func() {
		_, err := c.Fetch(leaderCtx, srv.URL+"/img", digestOf(content))
		leaderErr <- err
	}()
	<-first
	followerErr := make(chan error, 1)
	go func() {
		_, err := c.Fetch(t.Context(), srv.URL+"/img", digestOf(content))
		followerErr <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-leaderErr; !errors.Is(err, context.Canceled) {
		t.Errorf("leader: %v, want context.Canceled", err)
	}
	if err := <-followerErr; err != nil {
		t.Errorf("follower: %v", err)
	}
	assertNoPartials(t, c)
}

// TestNewCacheRemovesPartialDownloads: a download cut off by a kill -9
// leaves its .part file in Dir/tmp; the next NewCache on the directory
// removes it and keeps the finished blobs.
func TestNewCacheRemovesPartialDownloads(t *testing.T) {
	content := []byte("finished blob")
	ts := newTestServer(t, content)
	dir := filepath.Join(t.TempDir(), "cache")
	c := newTestCache(t, Options{Dir: dir, AllowLocalURLs: true})
	done, err := c.Fetch(t.Context(), ts.URL+"/ok", digestOf(content))
	if err != nil {
		t.Fatal(err)
	}
	partial := filepath.Join(dir, "tmp", digestOf([]byte("other"))+"-123.part")
	if err := os.WriteFile(partial, []byte("half of it"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	newTestCache(t, Options{Dir: dir, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Errorf("partial download still there after reopening: %v", err)
	}
	if _, err := os.Stat(done.Path); err != nil {
		t.Errorf("finished blob gone: %v", err)
	}
	if !strings.Contains(logs.String(), "partial download") || !strings.Contains(logs.String(), partial) {
		t.Errorf("log does not name the removed file:\n%s", logs.String())
	}
}
