package terminal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ControlType is the "type" of a Control message.
type ControlType string

// Control message types of protocol v1.
const (
	// TypeStatus: gateway → browser, progress before the PTY is ready.
	TypeStatus ControlType = "status"
	// TypeReady: gateway → browser, the PTY is ready; input may flow.
	TypeReady ControlType = "ready"
	// TypeExit: the shell exited with Code.
	TypeExit ControlType = "exit"
	// TypeError: the session failed; Error, Message and Retryable are set.
	TypeError ControlType = "error"
	// TypePing and TypePong: application-level keepalive, either direction.
	TypePing ControlType = "ping"
	TypePong ControlType = "pong"
)

// Progress is the "state" of a status message: what the gateway is waiting
// for before the terminal is ready.
type Progress string

// Progress values, in order.
const (
	ProgressQueued         Progress = "queued"
	ProgressDispatched     Progress = "dispatched"
	ProgressNodeConnecting Progress = "node_connecting"
	ProgressSpawning       Progress = "spawning"
)

// ValidProgress reports whether p is a progress value of protocol v1.
func ValidProgress(p Progress) bool {
	switch p {
	case ProgressQueued, ProgressDispatched, ProgressNodeConnecting, ProgressSpawning:
		return true
	}
	return false
}

// Control is a JSON message on ChanControl. Which fields are set depends on
// Type; on the wire "code" is the exit code (a number) for exit messages and
// the ErrorCode (a string) for error messages.
type Control struct {
	Type      ControlType
	Progress  Progress  // status: "state"
	SessionID string    // ready: "session_id"
	ExitCode  int       // exit: "code"
	Error     ErrorCode // error: "code"
	Message   string    // error: "message", detail for logs and the UI
	Retryable bool      // error: "retryable"
}

// Status returns a status message.
func Status(p Progress) Control { return Control{Type: TypeStatus, Progress: p} }

// Ready returns a ready message for session id.
func Ready(sessionID string) Control { return Control{Type: TypeReady, SessionID: sessionID} }

// Exit returns an exit message with the shell's exit code.
func Exit(code int) Control { return Control{Type: TypeExit, ExitCode: code} }

// Error returns an error message; Retryable comes from the code's table
// entry, so the gateway cannot contradict it.
func Error(code ErrorCode, message string) Control {
	return Control{Type: TypeError, Error: code, Message: message, Retryable: Retryable(code)}
}

// Ping returns a ping message.
func Ping() Control { return Control{Type: TypePing} }

// Pong returns a pong message.
func Pong() Control { return Control{Type: TypePong} }

// controlWire is Control as it appears on the wire.
type controlWire struct {
	Type      ControlType     `json:"type"`
	State     Progress        `json:"state,omitempty"`
	SessionID string          `json:"session_id,omitempty"`
	Code      json.RawMessage `json:"code,omitempty"`
	Message   string          `json:"message,omitempty"`
	Retryable *bool           `json:"retryable,omitempty"`
}

// MarshalJSON writes only the fields of c's type. It does not validate; use
// EncodeControl for that.
func (c Control) MarshalJSON() ([]byte, error) {
	w := controlWire{Type: c.Type}
	switch c.Type {
	case TypeStatus:
		w.State = c.Progress
	case TypeReady:
		w.SessionID = c.SessionID
	case TypeExit:
		w.Code = json.RawMessage(fmt.Sprint(c.ExitCode))
	case TypeError:
		code, err := json.Marshal(string(c.Error))
		if err != nil {
			return nil, err
		}
		w.Code = code
		w.Message = c.Message
		r := c.Retryable
		w.Retryable = &r
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads a control message and validates it (see
// DecodeControl).
func (c *Control) UnmarshalJSON(data []byte) error {
	var w controlWire
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("%w: control message: %w", ErrProtocol, err)
	}
	out := Control{Type: w.Type}
	switch w.Type {
	case TypeStatus:
		out.Progress = w.State
	case TypeReady:
		out.SessionID = w.SessionID
	case TypeExit:
		if len(w.Code) == 0 {
			return fmt.Errorf("%w: exit message without code", ErrProtocol)
		}
		if err := json.Unmarshal(w.Code, &out.ExitCode); err != nil {
			return fmt.Errorf("%w: exit code: %w", ErrProtocol, err)
		}
	case TypeError:
		var code string
		if len(w.Code) == 0 || json.Unmarshal(w.Code, &code) != nil {
			return fmt.Errorf("%w: error message without a string code", ErrProtocol)
		}
		out.Error = ErrorCode(code)
		out.Message = w.Message
		if w.Retryable != nil {
			out.Retryable = *w.Retryable
		}
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*c = out
	return nil
}

// Validate checks that c is a well-formed message of protocol v1: a known
// type, a known progress value, a session id on ready, a known error code
// on error. Protocol v1 is strict: anything new belongs to a new
// Subprotocol version.
func (c Control) Validate() error {
	switch c.Type {
	case TypeStatus:
		if !ValidProgress(c.Progress) {
			return fmt.Errorf("%w: unknown status state %q", ErrProtocol, c.Progress)
		}
	case TypeReady:
		if c.SessionID == "" {
			return fmt.Errorf("%w: ready message without session_id", ErrProtocol)
		}
	case TypeExit, TypePing, TypePong:
	case TypeError:
		if !KnownCode(c.Error) {
			return fmt.Errorf("%w: unknown error code %q", ErrProtocol, c.Error)
		}
	default:
		return fmt.Errorf("%w: unknown control type %q", ErrProtocol, c.Type)
	}
	return nil
}

// EncodeControl validates c and returns its JSON, the payload of a
// ChanControl frame.
func EncodeControl(c Control) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(c)
}

// DecodeControl parses and validates the payload of a ChanControl frame.
// Errors wrap ErrProtocol.
func DecodeControl(payload []byte) (Control, error) {
	var c Control
	if len(bytes.TrimSpace(payload)) == 0 {
		return c, fmt.Errorf("%w: empty control message", ErrProtocol)
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		if errors.Is(err, ErrProtocol) {
			return Control{}, err
		}
		return Control{}, fmt.Errorf("%w: control message: %w", ErrProtocol, err)
	}
	return c, nil
}
