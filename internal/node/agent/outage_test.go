package agent_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/signal"
)

// forwarder is a TCP relay on loopback in front of the fake control plane
// that can go down (connections refused) and come back on the same port.
type forwarder struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func newForwarder(t *testing.T, target string) *forwarder {
	fw := &forwarder{t: t, target: target}
	fw.up("127.0.0.1:0")
	t.Cleanup(fw.down)
	return fw
}

func (fw *forwarder) up(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fw.t.Fatalf("forwarder listen %s: %v", addr, err)
	}
	fw.mu.Lock()
	fw.ln, fw.addr = ln, ln.Addr().String()
	fw.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", fw.target)
			if err != nil {
				c.Close()
				continue
			}
			fw.mu.Lock()
			fw.conns = append(fw.conns, c, u)
			fw.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

// down closes the listener and every relayed connection.
func (fw *forwarder) down() {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.ln != nil {
		fw.ln.Close()
		fw.ln = nil
	}
	for _, c := range fw.conns {
		c.Close()
	}
	fw.conns = nil
}

// TestOutageReportedAfterRecovery: the control plane's port goes down
// (connections refused); once it is back, the first heartbeat that gets
// through reports node_agent_api_unreachable with what was seen and since
// when, and the next one is clean.
func TestOutageReportedAfterRecovery(t *testing.T) {
	t.Parallel()
	f := newFakeCP(t)
	fw := newForwarder(t, strings.TrimPrefix(f.srv.URL, "https://"))
	cfg := testConfig(f, t.TempDir())
	cfg.ControlPlaneURL = "https://" + fw.addr
	startAgentConfig(t, f, cfg, (&counter{}).handlers())
	fw.down()
	downAt := time.Now()
	time.Sleep(1500 * time.Millisecond) // a few failed heartbeats
	before := len(f.heartbeatLog())
	fw.up(fw.addr)
	var first, next heartbeatPost
	eventually(t, "two heartbeats after the outage", func() bool {
		hbs := f.heartbeatLog()
		if len(hbs) < before+2 {
			return false
		}
		first, next = hbs[before], hbs[before+1]
		return true
	})
	if first.Status != http.StatusOK || first.HB.Diagnostic != string(signal.APIUnreachable) ||
		!strings.Contains(first.HB.DiagnosticDetail, fw.addr) || first.HB.DiagnosticSince == nil ||
		first.HB.DiagnosticSince.Before(downAt.Add(-time.Second)) {
		t.Errorf("first heartbeat after the outage: %+v", first.HB)
	}
	if !strings.Contains(first.HB.DiagnosticDetail, "refused") && !strings.Contains(first.HB.DiagnosticDetail, "unreachable") {
		t.Errorf("detail %q does not say how the control plane was unreachable", first.HB.DiagnosticDetail)
	}
	if next.HB.Diagnostic != "" {
		t.Errorf("the next heartbeat still reports %q %q", next.HB.Diagnostic, next.HB.DiagnosticDetail)
	}
}
