package terminal

import (
	"errors"
	"fmt"
	"strings"
)

// ErrProtocol is wrapped by every decoding and validation error of this
// package. The gateway answers it with an error frame and close code for
// CodeProtocolError.
var ErrProtocol = errors.New("terminal protocol error")

// Channel is the first byte of every binary frame.
//
// Channel 2 (stderr in v5.channel.k8s.io) is deliberately unused: a PTY
// merges stdout and stderr into one stream, so there is nothing to put on it.
// It stays reserved so the numbering keeps matching Kubernetes' for anyone
// reading traces side by side.
type Channel byte

const (
	// ChanStdin carries keystrokes from the browser to the PTY.
	ChanStdin Channel = 0
	// ChanStdout carries PTY output (stdout and stderr merged) to the browser.
	ChanStdout Channel = 1
	// ChanResize carries a JSON Size from the browser (see EncodeResize).
	ChanResize Channel = 3
	// ChanControl carries a JSON Control message, in either direction.
	ChanControl Channel = 4
)

// String names the channel for logs.
func (c Channel) String() string {
	switch c {
	case ChanStdin:
		return "stdin"
	case ChanStdout:
		return "stdout"
	case ChanResize:
		return "resize"
	case ChanControl:
		return "control"
	}
	return fmt.Sprintf("channel(%d)", byte(c))
}

// Valid reports whether c is a channel of this protocol.
func (c Channel) Valid() bool {
	switch c {
	case ChanStdin, ChanStdout, ChanResize, ChanControl:
		return true
	}
	return false
}

const (
	// Subprotocol is the only WebSocket subprotocol the gateway ever echoes.
	Subprotocol = "drover.terminal.v1"
	// TokenSubprotocolPrefix prefixes the second subprotocol the browser
	// offers, "drover.token.<token>"; it is never echoed.
	TokenSubprotocolPrefix = "drover.token."
	// HeaderNonce carries the per-session nonce from terminal.open on the
	// node's stream request (never in the URL).
	HeaderNonce = "X-Drover-Terminal-Nonce"
)

// Encode returns a frame: the channel byte followed by payload. The payload
// is copied; Encode never fails.
func Encode(ch Channel, payload []byte) []byte {
	msg := make([]byte, 1+len(payload))
	msg[0] = byte(ch)
	copy(msg[1:], payload)
	return msg
}

// Decode splits a frame into its channel and payload. The payload aliases
// msg. It fails, wrapping ErrProtocol, on an empty message or an unknown
// channel (including the unused channel 2).
func Decode(msg []byte) (Channel, []byte, error) {
	if len(msg) == 0 {
		return 0, nil, fmt.Errorf("%w: empty frame", ErrProtocol)
	}
	ch := Channel(msg[0])
	if !ch.Valid() {
		return 0, nil, fmt.Errorf("%w: unknown channel %d", ErrProtocol, msg[0])
	}
	return ch, msg[1:], nil
}

// ClientProtocols returns the subprotocols a client offers: Subprotocol and
// the token subprotocol. It fails if the token is not a valid subprotocol
// name suffix (RFC 6455 requires an HTTP token: no spaces, commas or
// separators).
func ClientProtocols(token string) ([]string, error) {
	if err := validToken(token); err != nil {
		return nil, err
	}
	return []string{Subprotocol, TokenSubprotocolPrefix + token}, nil
}

// TokenFromProtocols validates the subprotocols a client offered and returns
// its token. It requires Subprotocol and exactly one token subprotocol;
// other offered names are ignored. Errors wrap ErrProtocol; the gateway
// answers a missing or empty token with CodeTokenInvalid.
func TokenFromProtocols(offered []string) (string, error) {
	var token string
	var haveProto, haveToken bool
	for _, p := range offered {
		p = strings.TrimSpace(p)
		switch {
		case p == Subprotocol:
			haveProto = true
		case strings.HasPrefix(p, TokenSubprotocolPrefix):
			if haveToken {
				return "", fmt.Errorf("%w: more than one token subprotocol", ErrProtocol)
			}
			haveToken = true
			token = strings.TrimPrefix(p, TokenSubprotocolPrefix)
		}
	}
	if !haveProto {
		return "", fmt.Errorf("%w: subprotocol %q not offered", ErrProtocol, Subprotocol)
	}
	if !haveToken {
		return "", fmt.Errorf("%w: no token subprotocol", ErrProtocol)
	}
	if err := validToken(token); err != nil {
		return "", err
	}
	return token, nil
}

// validToken checks that token is non-empty and made of RFC 7230 tchars.
func validToken(token string) error {
	if token == "" {
		return fmt.Errorf("%w: empty token", ErrProtocol)
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		ok := c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return fmt.Errorf("%w: token has a character not allowed in a subprotocol at byte %d", ErrProtocol, i)
		}
	}
	return nil
}
