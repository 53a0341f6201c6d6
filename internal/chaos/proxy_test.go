package chaos

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// proxyMode is how the fault proxy treats a new connection.
type proxyMode int

const (
	modePass      proxyMode = iota // forward to the target
	modeRefuse                     // the listener is closed: connections are refused
	modeBlackhole                  // accept and never forward or answer
	modeDelay                      // forward after the proxy's delay
	modeTLS                        // terminate TLS with the proxy's own config (another CA), never forward
)

// faultProxy is a TCP proxy on a fixed loopback port whose mode the test
// switches; a mode change drops the connections it holds.
type faultProxy struct {
	t      *testing.T
	addr   string
	target string

	mu     sync.Mutex
	ln     net.Listener
	mode   proxyMode
	delay  time.Duration
	tlsCfg *tls.Config
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{t: t, addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() { p.set(modeRefuse, 0, nil); p.wg.Wait() })
	return p
}

// set switches the mode: refuse closes the listener, any other mode
// (re)opens it on the same port; held connections are dropped either way.
func (p *faultProxy) set(m proxyMode, delay time.Duration, cfg *tls.Config) {
	p.mu.Lock()
	p.mode, p.delay, p.tlsCfg = m, delay, cfg
	for c := range p.conns {
		c.Close()
	}
	ln := p.ln
	if m == modeRefuse && ln != nil {
		ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	if m != modeRefuse && ln == nil {
		var err error
		for i := 0; i < 50; i++ { // the port may linger for a moment
			if ln, err = net.Listen("tcp", p.addr); err == nil {
				p.serve(ln)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		p.t.Fatalf("reopen proxy %s: %v", p.addr, err)
	}
}

func (p *faultProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.ln != ln {
				p.mu.Unlock()
				c.Close()
				return
			}
			p.conns[c] = struct{}{}
			mode, delay, cfg := p.mode, p.delay, p.tlsCfg
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.drop(c)
				p.handle(c, mode, delay, cfg)
			}()
		}
	}()
}

func (p *faultProxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *faultProxy) handle(c net.Conn, mode proxyMode, delay time.Duration, cfg *tls.Config) {
	switch mode {
	case modeBlackhole:
		_, _ = io.Copy(io.Discard, c)
		return
	case modeTLS:
		tc := tls.Server(c, cfg)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err == nil {
			_, _ = io.Copy(io.Discard, tc)
		}
		return
	case modeDelay:
		time.Sleep(delay)
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	defer p.drop(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side closes or the mode changes
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}
