package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeQMP is a scripted QMP server on a unix socket. handle gets each
// command (name, raw id) and writes whatever lines it wants.
type fakeQMP struct {
	path   string
	ln     net.Listener
	handle func(w *json.Encoder, cmd string, id json.RawMessage, conn net.Conn)
	mu     sync.Mutex
	seen   []string
	noHi   bool // never send the greeting
}

func newFakeQMP(t *testing.T, noHi bool, handle func(w *json.Encoder, cmd string, id json.RawMessage, conn net.Conn)) *fakeQMP {
	t.Helper()
	dir, err := os.MkdirTemp("", "qmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	f := &fakeQMP{path: filepath.Join(dir, "qmp.sock"), handle: handle, noHi: noHi}
	if f.ln, err = net.Listen("unix", f.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.ln.Close() })
	go f.serve()
	return f
}

func (f *fakeQMP) serve() {
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer func() { _ = conn.Close() }()
			enc := json.NewEncoder(conn)
			if !f.noHi {
				_ = enc.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
			}
			sc := bufio.NewScanner(conn)
			for sc.Scan() {
				var req struct {
					Execute string          `json:"execute"`
					ID      json.RawMessage `json:"id"`
				}
				if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
					return
				}
				f.mu.Lock()
				f.seen = append(f.seen, req.Execute)
				f.mu.Unlock()
				if req.Execute == "qmp_capabilities" {
					_ = enc.Encode(map[string]any{"return": map[string]any{}})
					continue
				}
				f.handle(enc, req.Execute, req.ID, conn)
			}
		}()
	}
}

type eventLog struct {
	mu  sync.Mutex
	evs []QMPEvent
}

func (l *eventLog) add(ev QMPEvent) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *eventLog) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.evs {
		out = append(out, e.Event)
	}
	return out
}

func TestQMPClient(t *testing.T) {
	f := newFakeQMP(t, false, func(w *json.Encoder, cmd string, id json.RawMessage, conn net.Conn) {
		switch cmd {
		case "query-status":
			// An event before and after the reply, a stale reply first.
			_ = w.Encode(map[string]any{"event": "RESET", "data": map[string]any{"guest": true},
				"timestamp": map[string]any{"seconds": 1700000000, "microseconds": 5}})
			_ = w.Encode(map[string]any{"return": map[string]any{"running": false}, "id": "stale"})
			_ = w.Encode(map[string]any{"return": map[string]any{"running": true, "status": "running"}, "id": id})
			_ = w.Encode(map[string]any{"event": "STOP"})
		case "bogus":
			_ = w.Encode(map[string]any{"error": map[string]any{"class": "CommandNotFound", "desc": "The command bogus has not been found"}, "id": id})
		case "quit":
			_ = w.Encode(map[string]any{"event": "SHUTDOWN", "data": map[string]any{"guest": false, "reason": "host-qmp-quit"}})
			_ = conn.Close()
		}
	})
	var evs eventLog
	ctx := context.Background()
	c, err := dialQMP(ctx, f.path, 2*time.Second, evs.add)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	var s statusInfo
	if err := c.Execute(ctx, "query-status", nil, &s); err != nil {
		t.Fatal(err)
	}
	if !s.Running || s.Status != "running" {
		t.Errorf("query-status = %+v, want running", s)
	}

	err = c.Execute(ctx, "bogus", map[string]string{"x": "y"}, nil)
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Errorf("bogus: %v, want a CommandNotFound *QMPError", err)
	}

	err = c.Execute(ctx, "quit", nil, nil)
	if !errors.Is(err, ErrQMPClosed) {
		t.Errorf("quit then EOF: %v, want ErrQMPClosed", err)
	}
	select {
	case <-c.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("Done not closed after EOF")
	}
	if err := c.Execute(ctx, "query-status", nil, nil); !errors.Is(err, ErrQMPClosed) {
		t.Errorf("after EOF: %v, want ErrQMPClosed", err)
	}
	got := evs.names()
	want := []string{"RESET", "STOP", "SHUTDOWN"}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("events %v, want %v", got, want)
		}
	}
	evs.mu.Lock()
	if at := evs.evs[0].At; at.Unix() != 1700000000 {
		t.Errorf("event timestamp %v", at)
	}
	evs.mu.Unlock()
}

func TestQMPClientCommandTimeout(t *testing.T) {
	f := newFakeQMP(t, false, func(w *json.Encoder, cmd string, id json.RawMessage, conn net.Conn) {
		if cmd == "slow" {
			time.Sleep(200 * time.Millisecond)
		}
		_ = w.Encode(map[string]any{"return": map[string]any{"status": cmd}, "id": id})
	})
	c, err := dialQMP(context.Background(), f.path, 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Execute(ctx, "slow", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow: %v, want a deadline error", err)
	}
	// The late reply to "slow" must not be taken for the next command's.
	var s statusInfo
	if err := c.Execute(context.Background(), "fast", nil, &s); err != nil || s.Status != "fast" {
		t.Fatalf("fast after a timed-out command = %+v, %v; want its own reply", s, err)
	}
}

func TestQMPDialFailures(t *testing.T) {
	t.Run("no greeting", func(t *testing.T) {
		f := newFakeQMP(t, true, nil)
		t0 := time.Now()
		if _, err := dialQMP(context.Background(), f.path, 200*time.Millisecond, nil); err == nil {
			t.Fatal("dial without a greeting succeeded")
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("dial took %v, want about its 200ms timeout", d)
		}
	})
	t.Run("no socket", func(t *testing.T) {
		if _, err := dialQMP(context.Background(), filepath.Join(t.TempDir(), "none.sock"), time.Second, nil); err == nil {
			t.Fatal("dial of a missing socket succeeded")
		}
	})
	t.Run("capabilities refused", func(t *testing.T) {
		dir, _ := os.MkdirTemp("", "qmp")
		defer func() { _ = os.RemoveAll(dir) }()
		ln, err := net.Listen("unix", filepath.Join(dir, "q.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = ln.Close() }()
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer func() { _ = conn.Close() }()
			_, _ = conn.Write([]byte(`{"QMP":{"version":{},"capabilities":[]}}` + "\n"))
			_, _ = bufio.NewReader(conn).ReadBytes('\n')
			_, _ = conn.Write([]byte(`{"error":{"class":"GenericError","desc":"no"}}` + "\n"))
			time.Sleep(100 * time.Millisecond)
		}()
		_, err = dialQMP(context.Background(), filepath.Join(dir, "q.sock"), time.Second, nil)
		var qe *QMPError
		if !errors.As(err, &qe) {
			t.Fatalf("dial: %v, want a *QMPError", err)
		}
	})
}

func TestProcVerdict(t *testing.T) {
	tests := []struct {
		name       string
		stop, hard bool
		reason     string
		panicked   bool
		want       string
	}{
		{"asked", true, false, "host-qmp-quit", false, "stopped"},
		{"asked hard", true, true, "", false, "stopped"},
		{"guest poweroff", false, false, "guest-shutdown", false, "stopped"},
		{"guest panic", false, false, "guest-panic", true, "crashed"},
		{"signal", false, false, "host-signal", false, "crashed"},
		{"killed", false, false, "", false, "crashed"},
	}
	for _, tc := range tests {
		p := newProc(1, "/x", discardLog())
		p.stopRequested.Store(tc.stop)
		p.hard.Store(tc.hard)
		if tc.reason != "" {
			b, _ := json.Marshal(shutdownEvent{Reason: tc.reason})
			p.onEvent(QMPEvent{Event: "SHUTDOWN", Data: b})
		}
		if tc.panicked {
			p.onEvent(QMPEvent{Event: "GUEST_PANICKED"})
		}
		if st, _, detail := p.verdict(); string(st) != tc.want || detail == "" {
			t.Errorf("%s: verdict %s %q, want %s with a detail", tc.name, st, detail, tc.want)
		}
	}
}
