// Package logstream is the wire format of a workload's log stream between
// the agent and the control plane: the node dials the control plane's
// node-facing logs route (nodeapi.LogsStream) with its node certificate and
// the session's single-use nonce (HeaderNonce), under Subprotocol, and sends
// binary WebSocket messages, each one Frame: a data frame carries one line
// (or a piece of a line longer than MaxLine) of one stream, and the last
// frame is an end frame saying why the stream ended. The control plane
// sends nothing but the close handshake; closing the connection is how it
// tells the node to stop.
//
// A message is one kind byte followed by the payload: for data frames the
// line's bytes (with its newline, when it had one), for the end frame an
// End as JSON. A message is at most MaxFrame bytes.
package logstream

import (
	"encoding/json"
	"errors"
	"fmt"
)

const (
	// Subprotocol is the WebSocket subprotocol of the node's logs stream.
	Subprotocol = "drover.logs.v1"
	// HeaderNonce carries the session's nonce (from logs.open) on the
	// node's upgrade request.
	HeaderNonce = "X-Drover-Logs-Nonce"
	// MaxLine is the longest line a data frame carries; a longer line is
	// sent as several frames of at most MaxLine bytes.
	MaxLine = 16 << 10
	// MaxFrame bounds one message: a kind byte and a line, or an end frame.
	MaxFrame = MaxLine + 1
	// maxEnd bounds an end frame's JSON (its message is cut to fit).
	maxEnd = 4 << 10
)

// Stream names a log stream.
type Stream string

// Streams: a container's stdout and stderr, a VM's serial console log.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
	Serial Stream = "serial"
)

// Valid reports whether s is one of the streams.
func (s Stream) Valid() bool { return s == Stdout || s == Stderr || s == Serial }

// Frame kinds (the first byte of a message).
const (
	kindEnd    byte = 0
	kindStdout byte = 1
	kindStderr byte = 2
	kindSerial byte = 3
)

// End reasons.
const (
	// ReasonEOF: the log ended (no follow, or the workload's log was
	// closed by the runtime).
	ReasonEOF = "eof"
	// ReasonError: the node could not read the log; Code and Message say why.
	ReasonError = "error"
	// ReasonLifetime: a follow stream reached its maximum lifetime.
	ReasonLifetime = "max_lifetime"
	// ReasonShutdown: the agent is stopping.
	ReasonShutdown = "agent_shutdown"
)

// End is the payload of the last frame.
type End struct {
	Reason  string `json:"reason"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// Frame is one decoded message: a line of Stream, or the End (End != nil).
type Frame struct {
	Stream Stream
	Data   []byte
	End    *End
}

// ErrProtocol wraps every malformed-frame error.
var ErrProtocol = errors.New("logs stream protocol error")

// EncodeData is the message carrying line (at most MaxLine bytes) of s.
func EncodeData(s Stream, line []byte) ([]byte, error) {
	var k byte
	switch s {
	case Stdout:
		k = kindStdout
	case Stderr:
		k = kindStderr
	case Serial:
		k = kindSerial
	default:
		return nil, fmt.Errorf("%w: unknown stream %q", ErrProtocol, s)
	}
	if len(line) > MaxLine {
		return nil, fmt.Errorf("%w: line of %d bytes exceeds %d", ErrProtocol, len(line), MaxLine)
	}
	out := make([]byte, 1+len(line))
	out[0] = k
	copy(out[1:], line)
	return out, nil
}

// EncodeEnd is the end frame of e; a message too long is cut.
func EncodeEnd(e End) []byte {
	if len(e.Message) > maxEnd-256 {
		e.Message = e.Message[:maxEnd-256]
	}
	b, _ := json.Marshal(e) // strings only: cannot fail
	return append([]byte{kindEnd}, b...)
}

// Decode parses one message. Data aliases msg.
func Decode(msg []byte) (Frame, error) {
	if len(msg) == 0 {
		return Frame{}, fmt.Errorf("%w: empty message", ErrProtocol)
	}
	if len(msg) > MaxFrame {
		return Frame{}, fmt.Errorf("%w: message of %d bytes exceeds %d", ErrProtocol, len(msg), MaxFrame)
	}
	switch msg[0] {
	case kindStdout:
		return Frame{Stream: Stdout, Data: msg[1:]}, nil
	case kindStderr:
		return Frame{Stream: Stderr, Data: msg[1:]}, nil
	case kindSerial:
		return Frame{Stream: Serial, Data: msg[1:]}, nil
	case kindEnd:
		var e End
		if err := json.Unmarshal(msg[1:], &e); err != nil {
			return Frame{}, fmt.Errorf("%w: end frame: %w", ErrProtocol, err)
		}
		if e.Reason == "" {
			return Frame{}, fmt.Errorf("%w: end frame without a reason", ErrProtocol)
		}
		return Frame{End: &e}, nil
	}
	return Frame{}, fmt.Errorf("%w: unknown frame kind %d", ErrProtocol, msg[0])
}
