package server

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// muxPoller waits for the framed connections that have nothing in flight
// to read, so that an idle agent's connection costs no goroutine: each
// connection is in an epoll set of the poller's own (level-triggered, one
// shot), and a readable one gets a goroutine (muxConn.burst) that reads
// what has arrived and re-arms it. The epoll descriptor itself is waited
// on through Go's network poller, so the poller parks one goroutine, no
// thread, for every connection of the listener.
type muxPoller struct {
	ep  *os.File
	efd int

	mu    sync.Mutex
	conns map[uint32]*muxConn // by the token of their epoll registration
	next  uint32
}

// newMuxPoller starts the poller; it stops on close.
func newMuxPoller() (*muxPoller, error) {
	efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(efd, true); err != nil {
		_ = unix.Close(efd)
		return nil, fmt.Errorf("epoll descriptor non-blocking: %w", err)
	}
	p := &muxPoller{ep: os.NewFile(uintptr(efd), "drover-mux-epoll"), efd: efd, conns: map[uint32]*muxConn{}}
	rc, err := p.ep.SyscallConn()
	if err != nil {
		_ = p.ep.Close()
		return nil, fmt.Errorf("epoll descriptor: %w", err)
	}
	go p.run(rc)
	return p, nil
}

// add registers c, whose connection reads through rc, unarmed: its first
// burst arms it. It fails for a connection without a descriptor; c is then
// served by a reader goroutine of its own.
func (p *muxPoller) add(c *muxConn, rc syscall.RawConn) error {
	p.mu.Lock()
	for p.next++; p.conns[p.next] != nil || p.next == 0; p.next++ {
	}
	reg := &pollReg{tok: p.next, rc: rc, efd: p.efd}
	reg.fn = reg.ctlFD
	p.conns[reg.tok] = c
	p.mu.Unlock()
	c.mu.Lock()
	c.reg = reg
	c.mu.Unlock()
	err := reg.ctl(unix.EPOLL_CTL_ADD, unix.EPOLLONESHOT) // disarmed (a hang-up still reports once)
	if err != nil {
		p.remove(c)
	}
	return err
}

// arm waits for c to become readable (or to hang up) once more; only the
// goroutine that reads c calls it.
func (p *muxPoller) arm(c *muxConn) error {
	return c.reg.ctl(unix.EPOLL_CTL_MOD, unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLONESHOT)
}

// remove forgets c; closing its descriptor takes it out of the epoll set.
func (p *muxPoller) remove(c *muxConn) {
	c.mu.Lock()
	reg := c.reg
	c.mu.Unlock()
	if reg == nil {
		return
	}
	p.mu.Lock()
	if p.conns[reg.tok] == c {
		delete(p.conns, reg.tok)
	}
	p.mu.Unlock()
}

// pollReg is a connection's registration with the poller: its token (the
// epoll event's data) and what epoll_ctl takes, kept so that re-arming
// after every burst allocates nothing. mu orders its users: the re-arm
// can start the next burst (which re-arms in turn) before the goroutine
// that re-armed has read epoll_ctl's result.
type pollReg struct {
	tok uint32
	rc  syscall.RawConn
	efd int
	fn  func(uintptr) // ctlFD, bound once

	mu  sync.Mutex
	op  int
	ev  unix.EpollEvent
	err error
}

func (r *pollReg) ctl(op int, events uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.op, r.ev = op, unix.EpollEvent{Events: events, Fd: int32(r.tok)}
	cerr := r.rc.Control(r.fn)
	err := r.err
	r.err = nil
	if cerr != nil {
		return cerr // the connection is closed
	}
	if err != nil {
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
}

func (r *pollReg) ctlFD(fd uintptr) { r.err = unix.EpollCtl(r.efd, r.op, int(fd), &r.ev) }

// close stops the poller (its connections are closed by their server).
func (p *muxPoller) close() { _ = p.ep.Close() }

// run hands each readable connection to a burst of its own until close.
func (p *muxPoller) run(rc syscall.RawConn) {
	var evs [128]unix.EpollEvent
	ready := make([]*muxConn, 0, len(evs))
	for {
		n := 0
		var werr error
		err := rc.Read(func(uintptr) bool {
			for {
				n, werr = unix.EpollWait(p.efd, evs[:], 0)
				if werr != unix.EINTR { //nolint:errorlint // a raw errno
					return n > 0 || werr != nil
				}
			}
		})
		if err != nil || werr != nil {
			return // closed
		}
		ready = ready[:0]
		p.mu.Lock()
		for _, ev := range evs[:n] {
			if c := p.conns[uint32(ev.Fd)]; c != nil {
				ready = append(ready, c)
			}
		}
		p.mu.Unlock()
		for _, c := range ready {
			if c.beginBurst() {
				go c.burst(true)
			}
		}
	}
}
