package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// QMP is QEMU's machine protocol: newline-delimited JSON over a unix
// socket. The server greets ({"QMP": {...}}), the client leaves capability
// negotiation with qmp_capabilities, then sends {"execute": ...} and gets
// {"return": ...} or {"error": {...}}; asynchronous {"event": ...} lines may
// arrive at any time, also between a command and its reply.

// ErrQMPClosed is returned by commands once the QMP connection is gone
// (QEMU exited or the client was closed).
var ErrQMPClosed = errors.New("qmp: connection closed")

// QMPError is an error reply.
type QMPError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *QMPError) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// QMPEvent is one asynchronous event.
type QMPEvent struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data,omitempty"`
	At    time.Time       `json:"-"`
}

// qmpMessage is any line the server sends.
type qmpMessage struct {
	QMP       json.RawMessage `json:"QMP,omitempty"`
	Return    json.RawMessage `json:"return,omitempty"`
	Error     *QMPError       `json:"error,omitempty"`
	Event     string          `json:"event,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
	ID        json.RawMessage `json:"id,omitempty"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp,omitempty"`
}

// qmpClient is one QMP connection. A reader goroutine owns the socket's
// read side: it routes replies to the waiting command and events to
// onEvent, in order. Commands are serialised: one is in flight at a time.
type qmpClient struct {
	conn    net.Conn
	onEvent func(QMPEvent)

	cmdMu   sync.Mutex // one command at a time
	nextID  uint64
	replies chan qmpMessage // the reader hands replies over here

	done    chan struct{} // closed when the reader stops
	errMu   sync.Mutex
	readErr error
}

// dialQMP connects to the QMP socket at path, reads the greeting and
// negotiates capabilities, all within timeout (a socket whose QEMU has
// another client never greets). onEvent runs on the reader goroutine and
// must not block.
func dialQMP(ctx context.Context, path string, timeout time.Duration, onEvent func(QMPEvent)) (*qmpClient, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	r := bufio.NewReaderSize(conn, 64<<10)
	var greeting qmpMessage
	if err := readMessage(r, &greeting); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("qmp: greeting: %w", err)
	}
	if greeting.QMP == nil {
		_ = conn.Close()
		return nil, errors.New("qmp: greeting: not a QMP greeting")
	}
	if _, err := conn.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n")); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("qmp: qmp_capabilities: %w", err)
	}
	var early []QMPEvent
	for {
		var m qmpMessage
		if err := readMessage(r, &m); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("qmp: qmp_capabilities: %w", err)
		}
		if m.Error != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("qmp_capabilities: %w", m.Error)
		}
		if m.Event != "" {
			early = append(early, toEvent(m))
			continue
		}
		if m.Return != nil {
			break
		}
	}
	if !stop() || ctx.Err() != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("qmp: %w", ctx.Err())
	}
	_ = conn.SetDeadline(time.Time{})
	c := &qmpClient{conn: conn, onEvent: onEvent, replies: make(chan qmpMessage, 8), done: make(chan struct{})}
	for _, ev := range early {
		c.emit(ev)
	}
	go c.read(r)
	return c, nil
}

func readMessage(r *bufio.Reader, m *qmpMessage) error {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return err
	}
	if err := json.Unmarshal(line, m); err != nil {
		return fmt.Errorf("malformed line %.200q: %w", line, err)
	}
	return nil
}

func toEvent(m qmpMessage) QMPEvent {
	ev := QMPEvent{Event: m.Event, Data: m.Data}
	if m.Timestamp != nil {
		ev.At = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
	}
	return ev
}

func (c *qmpClient) emit(ev QMPEvent) {
	if c.onEvent != nil {
		c.onEvent(ev)
	}
}

// read routes lines until the connection ends.
func (c *qmpClient) read(r *bufio.Reader) {
	defer close(c.done)
	for {
		var m qmpMessage
		if err := readMessage(r, &m); err != nil {
			c.errMu.Lock()
			c.readErr = err
			c.errMu.Unlock()
			return
		}
		if m.Event != "" {
			c.emit(toEvent(m))
			continue
		}
		if m.Return == nil && m.Error == nil {
			continue // not a reply
		}
		select {
		case c.replies <- m:
		default:
			// Only stale replies of commands whose callers gave up can
			// fill the buffer (commands are serialised): drop this one.
		}
	}
}

// Done is closed when the connection is gone.
func (c *qmpClient) Done() <-chan struct{} { return c.done }

// Close closes the connection; the reader stops and Done closes.
func (c *qmpClient) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

// Execute runs one command and decodes its return value into out (if not
// nil). A QMP error reply is a *QMPError; a connection that ends first is
// ErrQMPClosed.
func (c *qmpClient) Execute(ctx context.Context, command string, args any, out any) error {
	c.cmdMu.Lock()
	defer c.cmdMu.Unlock()
	select {
	case <-c.done:
		return fmt.Errorf("%s: %w", command, ErrQMPClosed)
	default:
	}
	c.nextID++
	id := strconv.FormatUint(c.nextID, 10)
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{command, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("%s: %w", command, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetWriteDeadline(dl)
	}
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: %w: %v", command, ErrQMPClosed, err)
	}
	_ = c.conn.SetWriteDeadline(time.Time{})
	for {
		select {
		case m := <-c.replies:
			if got := string(m.ID); got != "" && got != strconv.Quote(id) {
				continue // the late reply of a command whose caller gave up
			}
			if m.Error != nil {
				return fmt.Errorf("%s: %w", command, m.Error)
			}
			if out != nil {
				if err := json.Unmarshal(m.Return, out); err != nil {
					return fmt.Errorf("%s: decode return: %w", command, err)
				}
			}
			return nil
		case <-c.done:
			return fmt.Errorf("%s: %w", command, ErrQMPClosed)
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", command, ctx.Err())
		}
	}
}

// shutdownEvent is SHUTDOWN's data.
type shutdownEvent struct {
	Guest  bool   `json:"guest"`
	Reason string `json:"reason"`
}

// statusInfo is query-status's return.
type statusInfo struct {
	Running bool   `json:"running"`
	Status  string `json:"status"`
}
