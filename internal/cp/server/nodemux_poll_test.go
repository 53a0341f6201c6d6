package server

import (
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// readAnswers reads n answer frames from c and returns their status by
// stream.
func readAnswers(t *testing.T, c net.Conn, n int) map[uint32]int {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := map[uint32]int{}
	var hdr [nodemux.HeaderLen]byte
	for range n {
		f, err := nodemux.ReadFrame(c, &hdr, nodemux.MaxPayload)
		if err != nil {
			t.Fatalf("answer %d of %d: %v", len(got)+1, n, err)
		}
		resp, err := nodemux.ParseResponse(f.Payload)
		if err != nil || f.Type != nodemux.TypeResponse {
			t.Fatalf("answer frame type %d: %v", f.Type, err)
		}
		got[f.Stream] = resp.Status
	}
	return got
}

// TestMuxFramesAsTheyArrive: every frame is served however its bytes
// arrive: several in one TLS record (crypto/tls then holds the ones after
// the first), several records at once, and a frame split mid-header and
// mid-payload with pauses between the pieces. In the poller a burst must
// drain what crypto/tls holds before it re-arms (the socket is then
// empty: nothing would wake the connection again).
func TestMuxFramesAsTheyArrive(t *testing.T) { eachReader(t, testMuxFramesAsTheyArrive) }

func testMuxFramesAsTheyArrive(t *testing.T, rd readers) {
	f := newMuxFixture(t, echo, muxDefaults(), true, rd)
	req := func(stream uint32) []byte {
		return nodemux.AppendRequest(nil, stream, http.MethodPost, "/x", nil, []byte("payload"))
	}
	for _, tc := range []struct {
		name   string
		writes [][]byte
		pause  time.Duration
	}{
		{"one record", [][]byte{append(append(req(1), req(3)...), req(5)...)}, 0},
		{"records together", [][]byte{req(1), req(3), req(5), req(7)}, 0},
		{"split", [][]byte{req(1)[:4], req(1)[4:12], req(1)[12:], append(req(3), req(5)[:10]...), req(5)[10:]},
			50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, proto, err := f.dial(t.Context())
			if err != nil || proto != nodemux.Proto {
				t.Fatalf("dial: %q %v", proto, err)
			}
			defer c.Close()
			want := map[uint32]int{}
			for i, w := range tc.writes {
				if i > 0 {
					time.Sleep(tc.pause)
				}
				if _, err := c.Write(w); err != nil {
					t.Fatal(err)
				}
			}
			var hdr [nodemux.HeaderLen]byte
			var all []byte
			for _, w := range tc.writes {
				all = append(all, w...)
			}
			for len(all) > 0 { // the streams the writes carry
				copy(hdr[:], all)
				fr, n, err := nodemux.ParseHeader(&hdr, nodemux.MaxPayload)
				if err != nil {
					t.Fatal(err)
				}
				want[fr.Stream] = http.StatusCreated
				all = all[nodemux.HeaderLen+n:]
			}
			got := readAnswers(t, c, len(want))
			for s, st := range want {
				if got[s] != st {
					t.Fatalf("answers %v, want %v", got, want)
				}
			}
			// And the connection goes on.
			if _, err := c.Write(req(101)); err != nil {
				t.Fatal(err)
			}
			if got := readAnswers(t, c, 1); got[101] != http.StatusCreated {
				t.Fatalf("next request: %v", got)
			}
		})
	}
}

// TestMuxPollerIdleCostsNoGoroutine: in the poller an open connection
// with nothing in flight has no goroutine of its own once its linger is
// over (with a reader goroutine each, it has one).
func TestMuxPollerIdleCostsNoGoroutine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the poller is epoll's: linux only")
	}
	const conns = 40
	for _, rd := range []readers{{poll: true, linger: 100 * time.Millisecond}, {}} {
		f := newMuxFixture(t, echo, muxDefaults(), true, rd)
		before := testutil.SettledGoroutines()
		for i := range conns {
			c, _, err := f.dial(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(nodemux.AppendRequest(nil, 1, http.MethodGet, "/x", nil, nil)); err != nil {
				t.Fatal(err)
			}
			if got := readAnswers(t, c, 1); got[1] != http.StatusCreated {
				t.Fatalf("connection %d: %v", i, got)
			}
		}
		if !rd.poll {
			if grew := testutil.SettledGoroutines() - before; grew < conns {
				t.Fatalf("reader goroutines: %d goroutines for %d idle connections, want one each", grew, conns)
			}
			continue
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			grew := runtime.NumGoroutine() - before
			if grew < conns/4 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("poller: %d goroutines for %d idle connections after their linger", grew, conns)
			}
		}
	}
}
