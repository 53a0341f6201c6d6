package server

import (
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// A connection in the poller is read in bursts: when it becomes readable
// the poller starts a goroutine (burst) that reads a frame from the
// socket, then every frame crypto/tls has already buffered (whole records
// read past the last frame), and hands the connection back to the poller,
// which reports it again at once if the socket holds more (its epoll
// registration is level-triggered). "Only what is buffered" is a read
// through tls.Conn whose transport reads nothing (gatedConn.nonblock,
// errWouldBlock: crypto/tls keeps a partial record over it).

// errDrained is readReady's "no frame has begun".
var errDrained = errors.New("nothing to read")

// errWouldBlock is gatedConn's read while nonblock is set. It is a
// temporary net.Error, so crypto/tls keeps a partly read record and the
// connection usable.
var errWouldBlock = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "read would block" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

// polled registers c with the server's poller; false leaves it to a
// reader goroutine (no poller here, or a connection without a
// descriptor).
func (c *muxConn) polled() bool {
	if c.s.poll == nil {
		return false
	}
	sc, ok := c.gc.Conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	c.mu.Lock()
	c.reading = true // the first burst is the caller's
	c.mu.Unlock()
	if err := c.s.poll.add(c, rc); err != nil {
		c.mu.Lock()
		c.reading, c.reg = false, nil
		c.mu.Unlock()
		return false
	}
	return true
}

// beginBurst is the poller's: c is readable. False for a closed
// connection.
func (c *muxConn) beginBurst() bool {
	if c.ctx.Err() != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reading { // a hang-up reported while the first burst reads
		return false
	}
	c.reading = true
	if c.idleT != nil {
		c.idleT.Stop()
	}
	return true
}

// burst reads the frames that have arrived and starts their requests,
// then re-arms the poller: the first from the socket when the poller
// found it readable (fromSocket; the first burst, right after the
// handshake, reads only what came with it), the rest only from what
// crypto/tls has buffered. The last request runs on this goroutine, after
// the re-arm (a long-poll parks and returns; the next frames are read by
// the next burst); the others get goroutines of their own.
func (c *muxConn) burst(fromSocket bool) {
	var last *muxStream
	for {
		f, err := c.readReady(fromSocket)
		fromSocket = false
		if errors.Is(err, errDrained) {
			break
		}
		var st *muxStream
		if err == nil {
			st, err = c.handle(f)
		}
		if err != nil {
			c.fail(err)
			return
		}
		if st != nil {
			if last != nil {
				go last.serve()
			}
			last = st
		}
	}
	c.mu.Lock()
	c.reading = false
	c.mu.Unlock()
	c.armIdle()
	if err := c.s.poll.arm(c); err != nil {
		c.fail(err)
		return
	}
	if last != nil {
		last.serve()
	}
}

// readReady reads the next frame: the first bytes from the socket
// (fromSocket) or else only from what crypto/tls has buffered (errDrained
// if nothing), the rest as the reader goroutine would, all under the
// payload deadline (a peer that stops mid-frame is cut off).
func (c *muxConn) readReady(fromSocket bool) (nodemux.Frame, error) {
	var hdr [nodemux.HeaderLen]byte
	n := 0
	if !fromSocket {
		var err error
		c.gc.nonblock = true
		n, err = c.nc.Read(hdr[:])
		c.gc.nonblock = false
		if n == 0 {
			if errors.Is(err, errWouldBlock) {
				return nodemux.Frame{}, errDrained
			}
			return nodemux.Frame{}, err
		}
	}
	if c.s.payload > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(c.s.payload))
	}
	defer func() { _ = c.nc.SetReadDeadline(time.Time{}) }()
	if _, err := io.ReadFull(c.nc, hdr[n:]); err != nil {
		return nodemux.Frame{}, err
	}
	f, size, err := nodemux.ParseHeader(&hdr, nodemux.MaxPayload)
	if err != nil {
		return nodemux.Frame{}, err
	}
	return f, nodemux.ReadPayload(c.nc, &f, size)
}

// idleClose is the idle timer's: the connection closes if still idle.
func (c *muxConn) idleClose() {
	c.mu.Lock()
	idle := len(c.streams) == 0 && !c.reading
	c.mu.Unlock()
	if idle {
		c.close()
	}
}
