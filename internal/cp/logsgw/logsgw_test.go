package logsgw

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/logstream"
	"github.com/drover-dev/drover/internal/wire/task"
)

// fakeStore knows one instance "i1" on node "n1"; its tasks are those of
// a real store.
type fakeStore struct{ tasks store.Store }

func (fakeStore) GetInstance(_ context.Context, id string) (store.Instance, error) {
	if id == "i1" {
		return store.Instance{ID: "i1", Name: "web", HostID: "n1"}, nil
	}
	return store.Instance{}, store.ErrNotFound
}
func (f fakeStore) GetInstanceByName(ctx context.Context, name string) (store.Instance, error) {
	if name == "web" {
		return f.GetInstance(ctx, "i1")
	}
	return store.Instance{}, store.ErrNotFound
}
func (f fakeStore) GetTask(ctx context.Context, id string) (store.Task, error) {
	return f.tasks.GetTask(ctx, id)
}
func (f fakeStore) CancelTask(ctx context.Context, id string, at time.Time, audit func(store.Task) []store.AuditEvent) (store.Task, error) {
	return f.tasks.CancelTask(ctx, id, at, audit)
}

type online struct{}

func (online) NodeOnline(context.Context, string) bool { return true }

// fakeTasks stores each logs.open and hands it to node.
type fakeTasks struct {
	st   store.Store
	node func(task.LogsOpenParams)
}

func (f fakeTasks) Enqueue(ctx context.Context, t store.Task) error {
	if err := f.st.EnqueueTask(ctx, t); err != nil {
		return err
	}
	var p task.LogsOpenParams
	if err := json.Unmarshal(t.Params, &p); err != nil {
		return err
	}
	if f.node != nil {
		go f.node(p)
	}
	return nil
}

// gateway serves the API route and the node route of a gateway whose node
// behaves as node.
func gateway(t *testing.T, cfg Config, node func(nodeURL string, p task.LogsOpenParams)) (apiURL string, st store.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var nodeURL string
	ft := fakeTasks{st: st}
	if node != nil {
		ft.node = func(p task.LogsOpenParams) { node(nodeURL, p) }
	}
	g := New(cfg, fakeStore{tasks: st}, online{}, ft, audit.New(st, time.Now, log), log, time.Now)
	nmux := http.NewServeMux()
	nmux.HandleFunc("GET /n/{session_id}", func(w http.ResponseWriter, r *http.Request) {
		if err := g.NodeStream(w, r, "n1"); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
		}
	})
	ns := httptest.NewServer(nmux)
	t.Cleanup(ns.Close)
	nodeURL = ns.URL
	amux := http.NewServeMux()
	amux.HandleFunc("GET /api/v1/instances/{id}/logs", func(w http.ResponseWriter, r *http.Request) {
		if err := g.Stream(w, r); err != nil {
			b, _ := json.Marshal(err)
			http.Error(w, string(b), http.StatusGatewayTimeout)
		}
	})
	as := httptest.NewServer(amux)
	t.Cleanup(as.Close)
	return as.URL, st
}

func dialNode(t *testing.T, nodeURL string, p task.LogsOpenParams) *websocket.Conn {
	hdr := http.Header{}
	hdr.Set(logstream.HeaderNonce, p.Nonce)
	c, _, err := websocket.Dial(context.Background(), nodeURL+"/n/"+p.SessionID,
		&websocket.DialOptions{HTTPHeader: hdr, Subprotocols: []string{logstream.Subprotocol}})
	if err != nil {
		t.Errorf("node dial: %v", err)
		return nil
	}
	return c
}

// TestStreamTimeout: a node that never dials is a bounded 504 wait, and
// its logs.open, still queued, is canceled with its record.
func TestStreamTimeout(t *testing.T) {
	apiURL, st := gateway(t, Config{StreamTimeout: 300 * time.Millisecond}, nil)
	t0 := time.Now()
	resp, err := http.Get(apiURL + "/api/v1/instances/web/logs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), codeStreamTimeout) || time.Since(t0) > 3*time.Second {
		t.Errorf("no stream = %q after %s, want %s within 3s", body, time.Since(t0), codeStreamTimeout)
	}
	ts, err := st.ListTasks(t.Context(), store.TaskFilter{NodeID: "n1"})
	if err != nil || len(ts) != 1 || ts[0].State != api.TaskCanceled {
		t.Fatalf("logs.open after the timeout: %+v %v", ts, err)
	}
	evs, err := st.ListAudit(t.Context(), store.AuditFilter{Target: ts[0].ID, Action: "task.cancel"})
	if err != nil || len(evs) != 1 || evs[0].Actor != "logs-gateway" || evs[0].CorrelationID != ts[0].CorrelationID {
		t.Errorf("cancel records %+v %v", evs, err)
	}
}

// TestWrongNonceRefused: the node route wants the session's nonce.
func TestWrongNonceRefused(t *testing.T) {
	refused := make(chan error, 1)
	apiURL, _ := gateway(t, Config{StreamTimeout: time.Second}, func(nodeURL string, p task.LogsOpenParams) {
		hdr := http.Header{}
		hdr.Set(logstream.HeaderNonce, strings.Repeat("0", 64))
		_, _, err := websocket.Dial(context.Background(), nodeURL+"/n/"+p.SessionID,
			&websocket.DialOptions{HTTPHeader: hdr, Subprotocols: []string{logstream.Subprotocol}})
		refused <- err
	})
	resp, err := http.Get(apiURL + "/api/v1/instances/i1/logs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-refused; err == nil {
		t.Error("a stream with the wrong nonce was accepted")
	}
}

// TestBackpressureAndClose: a client that stops reading stalls the node's
// writes (bounded by socket buffers, not by memory here), and a client
// that goes closes the node's stream within a bound.
func TestBackpressureAndClose(t *testing.T) {
	var sent atomic.Int64
	nodeDone := make(chan error, 1)
	var once sync.Once
	apiURL, _ := gateway(t, Config{}, func(nodeURL string, p task.LogsOpenParams) {
		c := dialNode(t, nodeURL, p)
		if c == nil {
			return
		}
		// As the agent does: a reader sees the control plane's close.
		cctx := c.CloseRead(context.Background())
		line := []byte(strings.Repeat("x", 1023) + "\n")
		msg, _ := logstream.EncodeData(logstream.Stdout, line)
		for {
			if err := c.Write(cctx, websocket.MessageBinary, msg); err != nil {
				once.Do(func() { nodeDone <- err })
				return
			}
			sent.Add(1)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/api/v1/instances/i1/logs?follow=true", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || len(first) != 1024 {
		t.Fatalf("first line %d bytes, %v", len(first), err)
	}
	// Stop reading: the node's writes must stall.
	var a, b int64
	for range 20 {
		time.Sleep(250 * time.Millisecond)
		a, b = b, sent.Load()
		if a == b {
			break
		}
	}
	if a != b {
		t.Fatalf("the node kept writing (%d frames) to a client that reads nothing", b)
	}
	if b > 64<<10 { // 64 MiB of 1 KiB lines: far above any socket buffer
		t.Errorf("the node wrote %d frames before stalling", b)
	}
	t.Logf("the node stalled after %d frames (socket buffers)", b)
	cancel()
	resp.Body.Close()
	select {
	case <-nodeDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the node's stream is still open 5s after the client left")
	}
}
