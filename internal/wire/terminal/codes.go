package terminal

// ErrorCode names why a terminal session failed or ended. It travels in the
// "code" field of an error Control message and, as the close reason, in the
// WebSocket close frame. The terminal_* names are also the dashboard's
// signals, so the UI, the gateway logs and the dashboard agree.
type ErrorCode string

// The error codes of protocol v1. Adding one changes Subprotocol's version:
// DecodeControl rejects codes it does not know. The exception are codes
// only the gateway sends, to the browser, whose code table (codes.js) the
// same gateway serves: CodeTerminalRevoked and CodeSessionLimit.
const (
	// CodeNodeOffline: the instance's node has no live agent connection.
	CodeNodeOffline ErrorCode = "node_offline"
	// CodeDispatchTimeout: the terminal.open task was not claimed in time.
	CodeDispatchTimeout ErrorCode = "dispatch_timeout"
	// CodeNodeStreamTimeout: the browser was accepted but the node's stream
	// to the gateway never arrived (typically endpoint or profile drift).
	CodeNodeStreamTimeout ErrorCode = "node_stream_timeout"
	// CodePTYFailed: the node stream connected but the PTY or shell failed.
	CodePTYFailed ErrorCode = "terminal_pty_failed"
	// CodeNodeStreamMTLSFailed: the node stream reached the gateway but its
	// client certificate was rejected.
	CodeNodeStreamMTLSFailed ErrorCode = "terminal_node_stream_mtls_failed"
	// CodeOpenWithoutStream: the node reported terminal.open done, yet no
	// stream for the session arrived (stale agent build).
	CodeOpenWithoutStream ErrorCode = "terminal_open_without_stream"
	// CodeTokenInvalid: the token is missing, malformed or not signed by us.
	CodeTokenInvalid ErrorCode = "token_invalid"
	// CodeTokenExpired: the token's lifetime has passed.
	CodeTokenExpired ErrorCode = "token_expired"
	// CodeTokenReused: the single-use token was already redeemed.
	CodeTokenReused ErrorCode = "token_reused"
	// CodeTokenInURL: the token was sent in the URL's query string, where
	// proxies and access logs keep it. It must travel as a subprotocol.
	CodeTokenInURL ErrorCode = "token_in_url"
	// CodeTokenWrongAllocation: the token was minted for another allocation
	// than the one the browser asked for.
	CodeTokenWrongAllocation ErrorCode = "token_wrong_allocation"
	// CodeAllocationInactive: the allocation was released or failed after
	// the token was minted.
	CodeAllocationInactive ErrorCode = "allocation_inactive"
	// CodeGatewayError: the gateway itself failed (store unreachable, ...).
	CodeGatewayError ErrorCode = "gateway_error"
	// CodeOriginForbidden: the Origin header is not an allowed origin.
	CodeOriginForbidden ErrorCode = "origin_forbidden"
	// CodeProtocolError: a frame or message broke this protocol.
	CodeProtocolError ErrorCode = "protocol_error"
	// CodeSessionIdleTimeout: no input or output for the idle limit.
	CodeSessionIdleTimeout ErrorCode = "session_idle_timeout"
	// CodeSessionMaxLifetime: the session reached its maximum lifetime.
	CodeSessionMaxLifetime ErrorCode = "session_max_lifetime"
	// CodeTerminalRevoked: the session's node was revoked or disabled, or
	// the operator token that minted its terminal token was revoked.
	CodeTerminalRevoked ErrorCode = "terminal_revoked"
	// CodeSessionLimit: the node already has as many terminal sessions on
	// this gateway as it may.
	CodeSessionLimit ErrorCode = "terminal_session_limit"
)

// WebSocket close codes (RFC 6455 reserves 4000-4999 for applications).
// They mirror HTTP statuses so a browser console shows the class of failure
// even when the error frame was not rendered; the close reason carries the
// ErrorCode itself.
const (
	// CloseUnknown is used for an error code this version does not know.
	CloseUnknown = 4000
	// CloseProtocol: protocol_error.
	CloseProtocol = 4400
	// CloseUnauthorized: token_invalid, token_expired, token_reused.
	CloseUnauthorized = 4401
	// CloseForbidden: origin_forbidden, allocation_inactive,
	// terminal_revoked.
	CloseForbidden = 4403
	// CloseNodeOffline: node_offline.
	CloseNodeOffline = 4404
	// CloseTimeout: dispatch_timeout, node_stream_timeout,
	// session_idle_timeout, session_max_lifetime.
	CloseTimeout = 4408
	// CloseTooManySessions: terminal_session_limit.
	CloseTooManySessions = 4429
	// ClosePTYFailed: terminal_pty_failed.
	ClosePTYFailed = 4500
	// CloseInternal: gateway_error.
	CloseInternal = 4501
	// CloseNodeStream: the node's stream to the gateway is broken
	// (terminal_node_stream_mtls_failed, terminal_open_without_stream).
	CloseNodeStream = 4502
)

type codeInfo struct {
	retryable bool
	close     int
	recovery  string
}

// codeTable returns the facts about every code. It is a function, not a
// package variable, so nothing can mutate it.
func codeTable() map[ErrorCode]codeInfo {
	return map[ErrorCode]codeInfo{
		CodeNodeOffline: {true, CloseNodeOffline,
			"The node running this instance is offline. Wait for its agent to reconnect (check `drover nodes list`), then open the terminal again."},
		CodeDispatchTimeout: {true, CloseTimeout,
			"The node did not pick up the terminal request in time. It may be busy or reconnecting; try again in a moment."},
		CodeNodeStreamTimeout: {false, CloseTimeout,
			"The node never connected back to the terminal gateway. An operator should check that the node can reach the node-facing terminal endpoint (route, port, DNS, firewall); retrying will not help until then."},
		CodePTYFailed: {false, ClosePTYFailed,
			"The node could not start a shell. An operator should check the instance's user, shell and PTY permissions in the agent's terminal logs."},
		CodeNodeStreamMTLSFailed: {false, CloseNodeStream,
			"The gateway rejected the node's client certificate. An operator should repair the node certificate, CA trust or gateway client-certificate policy."},
		CodeOpenWithoutStream: {false, CloseNodeStream,
			"The node accepted the terminal request but never streamed it. The agent may be outdated; an operator should upgrade it and check the node-facing terminal endpoint."},
		CodeTokenInvalid: {false, CloseUnauthorized,
			"The terminal link is not valid. Reload the page and open the terminal again."},
		CodeTokenExpired: {true, CloseUnauthorized,
			"The terminal link expired before it was used. Open the terminal again to get a fresh one."},
		CodeTokenReused: {true, CloseUnauthorized,
			"This terminal link was already used. Open the terminal again to get a fresh one."},
		CodeTokenInURL: {false, CloseProtocol,
			"The terminal link put its token in the URL, which is refused because URLs are logged. Open the terminal from the Drover console, which sends the token safely."},
		CodeTokenWrongAllocation: {false, CloseUnauthorized,
			"The terminal link belongs to a different allocation. Open the terminal again from the allocation you want."},
		CodeAllocationInactive: {false, CloseForbidden,
			"The allocation is no longer active (released or failed). Ask an operator to check the allocation."},
		CodeGatewayError: {true, CloseInternal,
			"The terminal gateway hit an internal error. Try again in a moment; if it persists, an operator should check the control plane logs with this correlation id."},
		CodeOriginForbidden: {false, CloseForbidden,
			"This page is not allowed to open terminals. Open the terminal from the Drover console itself."},
		CodeProtocolError: {false, CloseProtocol,
			"The browser and the gateway disagree about the terminal protocol. Reload the page; if it persists, the console and gateway versions differ."},
		CodeSessionIdleTimeout: {true, CloseTimeout,
			"The terminal was closed after being idle. Open it again to start a new session."},
		CodeSessionMaxLifetime: {true, CloseTimeout,
			"The terminal reached its maximum session length. Open it again to start a new session."},
		CodeTerminalRevoked: {false, CloseForbidden,
			"Access was revoked while the terminal was open: the node was revoked or disabled, or the operator token that opened the terminal was revoked. Ask an operator before opening it again."},
		CodeSessionLimit: {true, CloseTooManySessions,
			"The node already has the most terminals open that the gateway allows. Close a terminal you no longer need, or try again in a moment."},
	}
}

// ErrorCodes returns every code of protocol v1, in declaration order.
func ErrorCodes() []ErrorCode {
	return []ErrorCode{
		CodeNodeOffline, CodeDispatchTimeout, CodeNodeStreamTimeout,
		CodePTYFailed, CodeNodeStreamMTLSFailed, CodeOpenWithoutStream,
		CodeTokenInvalid, CodeTokenExpired, CodeTokenReused,
		CodeTokenInURL, CodeTokenWrongAllocation, CodeAllocationInactive, CodeGatewayError,
		CodeOriginForbidden, CodeProtocolError,
		CodeSessionIdleTimeout, CodeSessionMaxLifetime,
		CodeTerminalRevoked, CodeSessionLimit,
	}
}

// KnownCode reports whether code is a code of protocol v1.
func KnownCode(code ErrorCode) bool {
	_, ok := codeTable()[code]
	return ok
}

// RecoveryText is the sentence the UI shows for code: what happened and what
// to do next. An unknown code gets a generic text.
func RecoveryText(code ErrorCode) string {
	if info, ok := codeTable()[code]; ok {
		return info.recovery
	}
	return "The terminal failed. Try opening it again; if it keeps failing, ask an operator to check the terminal gateway logs."
}

// Retryable reports whether a fresh attempt (a new token, a new session) may
// succeed without an operator fixing something first. Clients may retry
// these automatically, with backoff; the others need a person. An unknown
// code is not retryable.
func Retryable(code ErrorCode) bool {
	return codeTable()[code].retryable
}

// CloseCode is the WebSocket close code (4xxx) for code; CloseUnknown for a
// code this version does not know.
func CloseCode(code ErrorCode) int {
	if info, ok := codeTable()[code]; ok {
		return info.close
	}
	return CloseUnknown
}

// State is a readiness hop of a terminal session, as docs/contract.md
// lists them. The gateway records the last state reached, so a failure
// names the failed hop rather than "terminal failed".
type State string

// Readiness states, in the order a healthy session passes them; StateFailed
// may follow any of them.
const (
	StateTokenReady          State = "token_ready"
	StateBrowserWSReady      State = "browser_ws_ready"
	StateTerminalOpenSent    State = "terminal_open_sent"
	StateNodeStreamConnected State = "node_stream_connected"
	StatePTYReady            State = "pty_ready"
	StateFailed              State = "failed"
)

// States returns the readiness states in order, StateFailed last.
func States() []State {
	return []State{StateTokenReady, StateBrowserWSReady, StateTerminalOpenSent,
		StateNodeStreamConnected, StatePTYReady, StateFailed}
}

// ValidState reports whether s is one of the readiness states.
func ValidState(s State) bool {
	for _, v := range States() {
		if s == v {
			return true
		}
	}
	return false
}
