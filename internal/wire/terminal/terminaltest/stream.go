package terminaltest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/terminal"
)

// Event is one thing the gateway's end of a stream saw.
type Event struct {
	Ch      terminal.Channel
	Payload []byte
	Closed  error // set on the last event: the read error (a CloseError for a close frame)
}

// Stream is the gateway's end of one node stream. Unless the gateway is
// Raw, a reader decodes every frame into events.
type Stream struct {
	Conn   *websocket.Conn
	Req    *http.Request // the upgrade request (path, nonce, correlation id)
	Node   string        // the node id of the client certificate ("" without TLS options)
	t      testing.TB
	events chan Event
	done   <-chan struct{}
}

func (s *Stream) read(delay time.Duration, delayN int) {
	defer close(s.events)
	for i := 0; ; i++ {
		if i < delayN {
			time.Sleep(delay)
		}
		_, msg, err := s.Conn.Read(context.Background())
		ev := Event{Closed: err}
		if err == nil {
			if ev.Ch, ev.Payload, err = terminal.Decode(msg); err != nil {
				s.t.Errorf("terminaltest: the gateway got a bad frame: %v", err)
				continue
			}
		}
		select {
		case s.events <- ev:
		case <-s.done:
			return
		}
		if ev.Closed != nil {
			return
		}
	}
}

// Next returns the next event, failing the test after timeout.
func (s *Stream) Next(timeout time.Duration) Event {
	s.t.Helper()
	select {
	case ev, ok := <-s.events:
		if !ok {
			s.t.Fatal("terminaltest: the stream's reader ended")
		}
		return ev
	case <-time.After(timeout):
		s.t.Fatalf("no frame from the node within %s", timeout)
	}
	return Event{}
}

// Control reads the next frame and requires a control message.
func (s *Stream) Control(timeout time.Duration) terminal.Control {
	s.t.Helper()
	ev := s.Next(timeout)
	if ev.Closed != nil || ev.Ch != terminal.ChanControl {
		s.t.Fatalf("want a control frame, got channel %s %q (closed: %v)", ev.Ch, ev.Payload, ev.Closed)
	}
	c, err := terminal.DecodeControl(ev.Payload)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// ReadUntil collects stdout until it contains want; a control frame or the
// end of the stream before that fails the test. It returns what it read.
func (s *Stream) ReadUntil(want string, timeout time.Duration) string {
	s.t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(timeout)
	for !strings.Contains(out.String(), want) {
		ev := s.Next(time.Until(deadline))
		if ev.Closed != nil || ev.Ch != terminal.ChanStdout {
			s.t.Fatalf("waiting for %q: got channel %s %q (closed: %v); output so far:\n%s", want, ev.Ch, ev.Payload, ev.Closed, out.String())
		}
		out.Write(ev.Payload)
	}
	return out.String()
}

// UntilControl collects stdout until a control frame arrives and returns
// the control message and the stdout before it; the end of the stream
// first fails the test.
func (s *Stream) UntilControl(timeout time.Duration) (terminal.Control, string) {
	s.t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(timeout)
	for {
		ev := s.Next(time.Until(deadline))
		switch {
		case ev.Closed != nil:
			s.t.Fatalf("stream closed before a control frame: %v", ev.Closed)
		case ev.Ch == terminal.ChanStdout:
			out.Write(ev.Payload)
		case ev.Ch == terminal.ChanControl:
			c, err := terminal.DecodeControl(ev.Payload)
			if err != nil {
				s.t.Fatal(err)
			}
			return c, out.String()
		default:
			s.t.Fatalf("frame on %s from the node: %q", ev.Ch, ev.Payload)
		}
	}
}

// CloseStatus waits for the end of the stream (skipping frames) and
// returns the close code the node sent.
func (s *Stream) CloseStatus(timeout time.Duration) websocket.StatusCode {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if ev := s.Next(time.Until(deadline)); ev.Closed != nil {
			return websocket.CloseStatus(ev.Closed)
		}
	}
}

// Send writes one frame to the node.
func (s *Stream) Send(ch terminal.Channel, payload []byte) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Conn.Write(ctx, websocket.MessageBinary, terminal.Encode(ch, payload)); err != nil {
		s.t.Fatalf("send %s: %v", ch, err)
	}
}

// Stdin sends text on the stdin channel.
func (s *Stream) Stdin(text string) { s.t.Helper(); s.Send(terminal.ChanStdin, []byte(text)) }
