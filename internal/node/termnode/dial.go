package termnode

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// streamURL is BaseURL followed by the node API's terminal stream path
// (nodeapi.TerminalStream).
func streamURL(base, nodeID, sessionID string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("terminal URL %q: %w", base, err)
	}
	if (u.Scheme != "https" && u.Scheme != "wss") || u.Host == "" {
		return "", fmt.Errorf("terminal URL %q: must be an https:// URL of the gateway's node-facing listener", base)
	}
	if nodeID == "" {
		return "", errors.New("node id is not known yet")
	}
	return nodeapi.TerminalURL(u, nodeID, sessionID), nil
}

// dialStages records how far a dial got, so a failure names its hop.
type dialStages struct {
	connected atomic.Bool // a TCP connection was made
	handshook atomic.Bool // the server's certificate was verified (TLS 1.3: our certificate is sent next)
}

// dial opens the node leg of session p: a WebSocket over HTTP/1.1 and mTLS
// with the agent's current client certificate.
func (m *Manager) dial(ctx context.Context, p task.TerminalOpenParams, cid string) (*websocket.Conn, error) {
	// The signed params name the replica that holds the session; the
	// configured URL (maybe a load balancer over several replicas) is the
	// fallback for control planes that do not say.
	baseURL := m.cfg.BaseURL
	if p.StreamURL != "" {
		baseURL = p.StreamURL
	}
	u, err := streamURL(baseURL, m.cfg.NodeID, p.SessionID)
	if err != nil {
		return nil, &Error{api.CodedError{Code: CodeNodeStreamTimeout, Message: "cannot build the stream URL", Err: err}}
	}
	var base *tls.Config
	if m.cfg.TLSConfig != nil {
		base = m.cfg.TLSConfig()
	}
	hdr := http.Header{}
	hdr.Set(terminal.HeaderNonce, p.Nonce)
	conn, err := DialStream(ctx, StreamDial{URL: u, TLSConfig: base, Header: hdr, CorrelationID: cid,
		Subprotocol: terminal.Subprotocol, Timeout: m.cfg.DialTimeout})
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(readLimit)
	return conn, nil
}

// StreamDial says how to dial a node-facing stream of the control plane
// (the terminal's, or a workload's logs).
type StreamDial struct {
	// URL is the stream's https:// URL.
	URL string
	// TLSConfig is the agent's mTLS client configuration (cloned); nil
	// fails with CodeNodeStreamMTLSFailed.
	TLSConfig *tls.Config
	// Header holds the session's nonce header.
	Header        http.Header
	CorrelationID string
	// Subprotocol is required of the answer.
	Subprotocol string
	// Timeout bounds the dial (TCP, TLS, upgrade).
	Timeout time.Duration
}

// DialStream opens a node-facing stream: a WebSocket over HTTP/1.1 and
// mTLS. A failure is an *Error whose code names the hop that failed
// (CodeNodeStreamTimeout, CodeNodeStreamMTLSFailed, CodeSessionRejected,
// CodeShuttingDown when ctx was cancelled).
func DialStream(ctx context.Context, d StreamDial) (*websocket.Conn, error) {
	if d.TLSConfig == nil {
		return nil, &Error{api.CodedError{Code: CodeNodeStreamMTLSFailed, Message: "the agent has no node certificate to present"}}
	}
	if d.Timeout <= 0 {
		d.Timeout = DefaultDialTimeout
	}
	var st dialStages
	tlsCfg := d.TLSConfig.Clone()
	tlsCfg.NextProtos = []string{"http/1.1"} // an HTTP/2 stream cannot be upgraded
	verify := tlsCfg.VerifyConnection
	tlsCfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		st.handshook.Store(true)
		return nil
	}
	dialer := &net.Dialer{Timeout: d.Timeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err == nil {
				st.connected.Store(true)
			}
			return c, err
		},
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: d.Timeout,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr,
		// The nonce must reach the gateway named in the URL, nobody else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	hdr := d.Header.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	if d.CorrelationID != "" {
		hdr.Set(api.HeaderCorrelationID, d.CorrelationID)
	}
	dctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	conn, resp, err := websocket.Dial(dctx, d.URL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: hdr,
		Subprotocols: []string{d.Subprotocol}})
	if err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, &Error{api.CodedError{Code: CodeShuttingDown, Message: "the stream dial was cancelled", Err: err}}
		}
		return nil, classifyDial(err, resp, &st, dctx.Err() != nil, d.Timeout)
	}
	if got := conn.Subprotocol(); got != d.Subprotocol {
		_ = conn.Close(websocket.StatusPolicyViolation, "subprotocol "+d.Subprotocol+" required")
		return nil, &Error{api.CodedError{Code: CodeSessionRejected,
			Message: fmt.Sprintf("the gateway selected subprotocol %q, want %q", got, d.Subprotocol)}}
	}
	return conn, nil
}

// classifyDial maps a failed dial to the hop that failed: an HTTP answer
// from the gateway, the TLS handshake (either side rejecting the other's
// certificate), or reaching the endpoint at all.
func classifyDial(err error, resp *http.Response, st *dialStages, timedOut bool, timeout time.Duration) error {
	if resp != nil {
		return classifyResponse(err, resp)
	}
	var rhe tls.RecordHeaderError
	var alert tls.AlertError
	var cve *tls.CertificateVerificationError
	tlsRefused := errors.As(err, &alert) || errors.As(err, &cve) || strings.Contains(err.Error(), "remote error: tls")
	switch {
	case errors.As(err, &rhe) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return &Error{api.CodedError{Code: CodeNodeStreamTimeout,
			Message: "the terminal endpoint does not speak TLS; is NODE_AGENT_TERMINAL_URL the gateway's node-facing listener?", Err: err}}
	case tlsRefused:
		return &Error{api.CodedError{Code: CodeNodeStreamMTLSFailed, Message: "the TLS handshake with the gateway failed (certificate rejected)", Err: err}}
	case timedOut || isTimeout(err):
		return &Error{api.CodedError{Code: CodeNodeStreamTimeout, Message: fmt.Sprintf("the gateway did not answer within %s", timeout), Err: err}}
	case !st.connected.Load():
		return &Error{api.CodedError{Code: CodeNodeStreamTimeout, Message: "cannot reach the gateway's node-facing terminal endpoint", Err: err}}
	case !st.handshook.Load():
		return &Error{api.CodedError{Code: CodeNodeStreamMTLSFailed, Message: "the TLS handshake with the gateway failed", Err: err}}
	default:
		// TLS 1.3: the server verifies our certificate after the client's
		// side of the handshake is done; a server that drops the
		// connection right then has rejected it.
		return &Error{api.CodedError{Code: CodeNodeStreamMTLSFailed,
			Message: "the gateway closed the connection after the TLS handshake (client certificate rejected?)", Err: err}}
	}
}

// classifyResponse maps a non-101 answer (or a 101 that broke the protocol).
func classifyResponse(err error, resp *http.Response) error {
	status := resp.StatusCode
	if status == http.StatusSwitchingProtocols {
		return &Error{api.CodedError{Code: CodeSessionRejected, Message: "the gateway's upgrade answer broke the WebSocket protocol", Err: err}}
	}
	var body []byte
	if resp.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 1024))
		_ = resp.Body.Close()
	}
	var eb api.ErrorBody
	hasEnvelope := json.Unmarshal(body, &eb) == nil && eb.Error.Code != ""
	detail := fmt.Sprintf("the gateway answered HTTP %d", status)
	if hasEnvelope {
		detail += " " + eb.Error.Code + ": " + eb.Error.Message
	}
	switch {
	case status == http.StatusUnauthorized:
		return &Error{api.CodedError{Code: CodeNodeStreamMTLSFailed, Message: detail + " (no client certificate reached the gateway; does something in between terminate TLS?)", Err: err}}
	case status == http.StatusForbidden || status == http.StatusConflict || status == http.StatusGone ||
		(status == http.StatusNotFound && hasEnvelope):
		return &Error{api.CodedError{Code: CodeSessionRejected, Message: detail, Err: err}}
	default:
		// A 404 without our envelope, a redirect, a proxy's 502: the URL
		// does not lead to the gateway's node-facing stream route.
		return &Error{api.CodedError{Code: CodeNodeStreamTimeout,
			Message: detail + "; is NODE_AGENT_TERMINAL_URL the gateway's node-facing listener?", Err: err}}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// writeControl sends one control message.
func writeControl(ctx context.Context, conn *websocket.Conn, c terminal.Control) error {
	b, err := terminal.EncodeControl(c)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanControl, b))
}

// failStream tells the gateway why the session cannot start and closes the
// stream with the code's close code.
func failStream(conn *websocket.Conn, code terminal.ErrorCode, msg string) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := writeControl(ctx, conn, terminal.Error(code, msg)); err != nil {
		_ = conn.CloseNow()
		return
	}
	_ = conn.Close(websocket.StatusCode(terminal.CloseCode(code)), string(code))
}
