// Package terminal owns the wire protocol of Drover's browser terminals, the
// one contract shared by the control plane's terminal gateway, the agent and
// the browser: binary frames with a one-byte channel prefix, JSON control
// messages (status, ready, exit, error, ping, pong), resize messages and
// their debouncing, the error codes with their recovery texts, retry flags
// and WebSocket close codes, the readiness states of a terminal session, and
// an asciicast v2 recorder.
//
// It must stay pure: no network code, no WebSocket library, no PTY, no
// goroutines beyond the Debouncer's timer, no logging. The gateway and the
// agent do I/O; this package only encodes, validates and records, so every
// rule here is testable without a socket.
//
// # Why frames are binary
//
// Every WebSocket message is a binary message whose first byte is the
// channel (see Channel), in the style of Kubernetes' v5.channel.k8s.io. A
// PTY hands out bytes, not characters: a read can end in the middle of a
// multibyte UTF-8 sequence and the rest arrives in the next read. A text
// WebSocket message must be valid UTF-8, so sending PTY output as text would
// force either buffering in the agent or corrupting split characters (and
// browsers close the socket on invalid text frames). Binary frames carry the
// bytes unchanged; the browser's terminal emulator reassembles characters
// across frames with a streaming decoder. Only the Recorder, which writes
// JSON strings, has to care about split sequences, and it holds back an
// incomplete trailing sequence until the next chunk.
//
// # Authentication
//
// The browser cannot set headers on a WebSocket, and a token in the URL
// ends up in access logs. The token therefore travels only as a second
// offered subprotocol "drover.token.<token>" next to Subprotocol; the
// gateway echoes only Subprotocol, never the token (see ClientProtocols and
// TokenFromProtocols).
package terminal
