package server

import (
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// A connection in the poller is read in bursts: when it becomes readable
// the poller starts a goroutine (burst) that reads every frame that has
// arrived, without waiting for more, and hands the connection back to
// the poller. crypto/tls keeps what it has read of the next record, and
// may hold whole records past the last frame, so "nothing more" is a read
// through tls.Conn in which the socket, read once without waiting, had
// nothing (gatedConn.nonblock): only then is the connection re-armed.

// errDrained is readReady's "no frame has begun".
var errDrained = errors.New("nothing to read")

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
		c.reading = false
		c.mu.Unlock()
		c.rc = nil
		return false
	}
	c.gc.now = newNowReader(rc)
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
// then re-arms the poller. The last request runs on this goroutine, after
// the re-arm (a long-poll parks and returns; the next frames are read by
// the next burst); the others get goroutines of their own.
func (c *muxConn) burst() {
	var last *muxStream
	for {
		f, err := c.readReady()
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

// readReady reads the next frame if one has begun to arrive (errDrained
// if not): its first bytes without waiting, the rest as the reader
// goroutine would, under the payload deadline.
func (c *muxConn) readReady() (nodemux.Frame, error) {
	var hdr [nodemux.HeaderLen]byte
	c.gc.nonblock = true
	n, err := c.nc.Read(hdr[:])
	c.gc.nonblock = false
	if n == 0 {
		if errors.Is(err, errWouldBlock) {
			return nodemux.Frame{}, errDrained
		}
		return nodemux.Frame{}, err
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
