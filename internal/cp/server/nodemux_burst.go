package server

import (
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// A connection in the poller is read in bursts: when it becomes readable
// the poller starts a goroutine (burst) that reads a frame from the
// socket, then goes on as a reader goroutine would while frames keep
// coming (within the server's linger of each other), and hands the
// connection back to the poller, which reports it again at once if the
// socket holds more (its epoll registration is level-triggered). Records
// that crypto/tls has buffered past the last frame are read before that:
// a read through tls.Conn returns them without touching the socket, and
// the first burst, which must not wait, reads through a transport that
// reads nothing (gatedConn.nonblock, errWouldBlock: crypto/tls keeps a
// partial record over it).

// errDrained is readNext's "no frame has begun".
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

// burst reads frames and starts their requests, each on a goroutine of
// its own, then hands the connection back to the poller. The first frame
// comes from the socket when the poller found it readable (fromSocket);
// the first burst, right after the handshake, takes only what came with
// it (what crypto/tls has buffered). After a frame that came within the
// server's linger of the one before it, the burst waits up to the linger
// for the next, as a reader goroutine would: a busy agent's requests skip
// the poller (its wake, an epoll_wait and the re-arm), and only a
// connection quiet for that long goes back to it. An agent at the default
// heartbeat holds no goroutine between its requests.
func (c *muxConn) burst(fromSocket bool) {
	wait := readBuffered
	if fromSocket {
		wait = readArrived
	}
	for {
		f, err := c.readNext(wait)
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
			c.s.workers.serve(st)
		}
		wait = readBuffered
		now := time.Now()
		if now.Sub(c.lastFrame) < c.s.linger {
			wait = readLinger
		}
		c.lastFrame = now
	}
	c.mu.Lock()
	c.reading = false
	c.mu.Unlock()
	c.armIdle()
	if err := c.s.poll.arm(c); err != nil {
		c.fail(err)
	}
}

// How readNext waits for a frame's first bytes.
type readWait uint8

const (
	readArrived  readWait = iota // they have arrived (the poller said so)
	readBuffered                 // only what crypto/tls has buffered
	readLinger                   // up to the server's linger
)

// readNext reads the next frame, errDrained if none began as wait allows;
// once its first bytes are in, the rest comes as the reader goroutine
// reads it, under the payload deadline (a peer that stops mid-frame is
// cut off).
func (c *muxConn) readNext(wait readWait) (nodemux.Frame, error) {
	var hdr [nodemux.HeaderLen]byte
	n := 0
	if wait == readLinger && c.s.linger <= 0 {
		wait = readBuffered
	}
	if wait != readArrived {
		var err error
		if wait == readLinger {
			_ = c.nc.SetReadDeadline(time.Now().Add(c.s.linger))
		} else {
			c.gc.nonblock = true
		}
		n, err = c.nc.Read(hdr[:])
		c.gc.nonblock = false
		if n == 0 {
			if errors.Is(err, errWouldBlock) || errors.Is(err, os.ErrDeadlineExceeded) {
				return nodemux.Frame{}, errDrained
			}
			return nodemux.Frame{}, err
		}
	}
	if c.s.payload > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(c.s.payload))
	} else {
		_ = c.nc.SetReadDeadline(time.Time{})
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
