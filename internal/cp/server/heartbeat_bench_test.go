package server

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// discardWriter is a reusable http.ResponseWriter, so the benchmark counts
// the handler's allocations and not a recorder's.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }

// heartbeatEnv is the node handler of a server on SQLite and a request
// from an enrolled node, reusable across iterations.
type heartbeatEnv struct {
	h    http.Handler
	r    *http.Request
	body *bytes.Reader
	w    *discardWriter
}

func newHeartbeatEnv(tb testing.TB) *heartbeatEnv {
	tb.Helper()
	ctx := tb.Context()
	st, err := sqlite.Open(ctx, filepath.Join(tb.TempDir(), "d.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	s, err := New(ctx, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), InsecurePlaintextKeys: true}, st)
	if err != nil {
		tb.Fatal(err)
	}
	const id = "bench-node"
	now := time.Now().UTC()
	if err := st.CreateHost(ctx, store.Host{ID: id, OSFamily: api.OSLinux, Enabled: true, Status: api.HostUnknown,
		EnrolledAt: now.Add(-time.Hour), CreatedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-time.Hour)}); err != nil {
		tb.Fatal(err)
	}
	keyPEM, err := pki.NewNodeKey()
	if err != nil {
		tb.Fatal(err)
	}
	csr, err := pki.CSRFor(keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	certPEM, _, _, err := s.ca.SignNodeCSR(csr, id, time.Hour, now)
	if err != nil {
		tb.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		tb.Fatal(err)
	}
	e := &heartbeatEnv{h: s.NodeHandler(), body: bytes.NewReader(nil), w: &discardWriter{h: http.Header{}}}
	e.r, err = http.NewRequestWithContext(ctx, http.MethodPost, "https://cp"+nodeapi.Heartbeat.Path(id), nil)
	if err != nil {
		tb.Fatal(err)
	}
	e.r.Header.Set("Content-Type", "application/json")
	e.r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
	e.r.Body = io.NopCloser(e.body)
	return e
}

// beat serves one heartbeat with body and fails on anything but 200.
func (e *heartbeatEnv) beat(tb testing.TB, body []byte) {
	e.body.Reset(body)
	clear(e.w.h)
	e.w.status = http.StatusOK
	e.h.ServeHTTP(e.w, e.r)
	if e.w.status != http.StatusOK {
		tb.Fatalf("heartbeat: status %d", e.w.status)
	}
}

func heartbeatBody(tb testing.TB, freeMiB int) []byte {
	tb.Helper()
	c := api.Capacity{VCPUs: 8, MemoryMiB: 16384, DiskGiB: 100}
	free := c
	free.MemoryMiB = freeMiB
	b, err := json.Marshal(api.Heartbeat{AgentVersion: "bench", Capacity: &api.CapacityReport{
		Total: c, Free: free, Reserved: api.Capacity{VCPUs: 1, MemoryMiB: 1024}}})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// BenchmarkHeartbeat is the node API's heartbeat route, correlation id,
// routing and certificate binding included (no TLS or HTTP/2): "unchanged"
// is the steady state (same capacity, healthy host), "changed" reports a
// new capacity on every beat (a store write each).
func BenchmarkHeartbeat(b *testing.B) {
	b.Run("unchanged", func(b *testing.B) {
		e := newHeartbeatEnv(b)
		body := heartbeatBody(b, 8192)
		e.beat(b, body) // first heartbeat: healthy, capacity stored
		b.ReportAllocs()
		for b.Loop() {
			e.beat(b, body)
		}
	})
	b.Run("changed", func(b *testing.B) {
		e := newHeartbeatEnv(b)
		bodies := [][]byte{heartbeatBody(b, 8192), heartbeatBody(b, 4096)}
		e.beat(b, bodies[1])
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			e.beat(b, bodies[i%2])
			i++
		}
	})
}
