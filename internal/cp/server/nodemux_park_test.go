package server

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// TestMuxParked: a request its handler parks (httpapi.Parker) is answered
// when its park finishes, from another goroutine, after the handler
// returned; the agent's cancel and the connection's close give a parked
// request up (Park.Cancel); a panic in a function the park started closes
// the connection, as a handler's panic does.
func TestMuxParked(t *testing.T) { eachReader(t, testMuxParked) }

func testMuxParked(t *testing.T, rd readers) {
	parks := make(chan *httpapi.Park, 1)
	cancels := make(chan uint32, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pk, ok := w.(httpapi.Parker)
		if !ok {
			t.Error("the framed connection's ResponseWriter is not a Parker")
			return
		}
		p := pk.Park()
		stream := uint32(len(r.URL.Path)) // the tests' paths tell their streams apart
		p.OnCancel(func() { cancels <- stream })
		p.Returned() // the top of the chain (NodeAuthID in the node API)
		parks <- p
	})
	f := newMuxFixture(t, h, muxDefaults(), true, rd)
	dial := func(t *testing.T) *muxTestConn {
		c, proto, err := f.dial(t.Context())
		if err != nil || proto != nodemux.Proto {
			t.Fatalf("dial: %q %v", proto, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return &muxTestConn{t: t, c: c}
	}
	park := func(t *testing.T) *httpapi.Park {
		t.Helper()
		select {
		case p := <-parks:
			return p
		case <-time.After(5 * time.Second):
			t.Fatal("the handler did not park")
			return nil
		}
	}
	cancelled := func(t *testing.T, want uint32) {
		t.Helper()
		select {
		case got := <-cancels:
			if got != want {
				t.Fatalf("cancelled %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the parked request was not cancelled")
		}
	}

	t.Run("finished later", func(t *testing.T) {
		c := dial(t)
		c.send(nodemux.AppendRequest(nil, 1, http.MethodGet, "/a", nil, nil))
		p := park(t)
		time.Sleep(50 * time.Millisecond) // the handler has returned: nothing answered yet
		p.Go(func() { p.Finish(nil) })
		if got := readAnswers(t, c.c, 1); got[1] != http.StatusOK {
			t.Fatalf("answers %v", got)
		}
		select {
		case s := <-cancels:
			t.Fatalf("a finished request was cancelled (%d)", s)
		default:
		}
	})
	t.Run("agent cancels", func(t *testing.T) {
		c := dial(t)
		c.send(nodemux.AppendRequest(nil, 1, http.MethodGet, "/ab", nil, nil))
		p := park(t)
		c.send(nodemux.AppendHeader(nil, nodemux.TypeCancel, 1, 0))
		cancelled(t, 3)
		p.Finish(nil) // no answer for a cancelled stream: the next one is the next request's
		c.send(nodemux.AppendRequest(nil, 3, http.MethodGet, "/abc", nil, nil))
		p = park(t)
		p.Finish(nil)
		if got := readAnswers(t, c.c, 1); got[3] != http.StatusOK || len(got) != 1 {
			t.Fatalf("answers %v, want stream 3's alone", got)
		}
	})
	t.Run("connection closes", func(t *testing.T) {
		c := dial(t)
		c.send(nodemux.AppendRequest(nil, 1, http.MethodGet, "/abcd", nil, nil))
		p := park(t)
		_ = c.c.Close()
		cancelled(t, 5)
		p.Finish(nil)
	})
	t.Run("panic after parking", func(t *testing.T) {
		c := dial(t)
		c.send(nodemux.AppendRequest(nil, 1, http.MethodGet, "/abcde", nil, nil))
		p := park(t)
		p.Go(func() { panic("resumed handler bug") })
		c.closed()
	})
}

// muxTestConn is a raw framed connection of a test.
type muxTestConn struct {
	t *testing.T
	c net.Conn
}

func (c *muxTestConn) send(b []byte) {
	c.t.Helper()
	if _, err := c.c.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

// closed checks that the server closes the connection.
func (c *muxTestConn) closed() {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.c.Read(make([]byte, 64)); err == nil {
		c.t.Fatalf("connection still open (read %d)", n)
	}
}
