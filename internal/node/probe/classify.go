// Package probe is the node's view of its connections to the control
// plane: it classifies a failed request into an outage signal of
// internal/wire/signal (DNS, refused, timeout, TLS, client certificate,
// 401/403, 429, protocol mismatch), runs the step-by-step endpoint checks
// of `drover-agent preflight` (DNS → TCP → TLS → one HTTP request, with an
// optional resolve address that replaces DNS but keeps the URL's host for
// SNI and certificate verification), and measures filesystem usage.
package probe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// Kind says how a request failed, finer than its signal.
type Kind string

// The failure kinds.
const (
	KindDNS         Kind = "dns"
	KindRefused     Kind = "refused"
	KindTimeout     Kind = "timeout"
	KindUnreachable Kind = "unreachable" // another network error (no route, reset)
	KindTLS         Kind = "tls"         // the server's certificate or the handshake
	KindClientCert  Kind = "client_cert" // the server rejected the node's certificate
	KindAuth        Kind = "auth"        // 401/403
	KindRateLimited Kind = "rate_limited"
	KindProtocol    Kind = "protocol" // unknown route or API version
	KindServer      Kind = "server"   // 5xx
	KindDiskFull    Kind = "disk_full"
)

// Failure is a classified failure.
type Failure struct {
	Signal signal.Name
	Kind   Kind
	// Detail names the kind and the target, e.g. "refused: cp.example:8443:
	// dial tcp 10.0.0.5:8443: connect: connection refused".
	Detail string
	// CorrelationID is the error envelope's, when the control plane sent one.
	CorrelationID string
}

// Classify maps err, from a request to target (host:port), to a failure.
// ok is false for nil, for a cancelled context (the caller stopping) and
// for answers that are not outages (400, 404 of a task, 409, 422).
func Classify(err error, target string) (f Failure, ok bool) {
	if err == nil || errors.Is(err, context.Canceled) {
		return Failure{}, false
	}
	kind, ok := kindOf(err)
	if !ok {
		return Failure{}, false
	}
	f = Failure{Kind: kind, Signal: SignalOf(kind), Detail: string(kind) + ": " + target + ": " + err.Error()}
	var ae *nodeapi.Error
	if errors.As(err, &ae) {
		f.Detail = fmt.Sprintf("%s: %s: %d %s", kind, target, ae.Status, firstNonEmpty(ae.Code, http.StatusText(ae.Status)))
		if ae.Message != "" {
			f.Detail += ": " + ae.Message
		}
		if kind == KindAuth && strings.Contains(ae.Code, "revoked") {
			f.Detail = "identity revoked: " + f.Detail
		}
		f.CorrelationID = correlationID(ae.Body)
	}
	return f, true
}

// SignalOf is the signal of a kind on the control plane's node API.
func SignalOf(k Kind) signal.Name {
	switch k {
	case KindTLS:
		return signal.APITLSFailed
	case KindClientCert, KindAuth:
		return signal.AuthFailed
	case KindRateLimited:
		return signal.EdgeRateLimited
	case KindProtocol:
		return signal.BinaryInvalid
	case KindDiskFull:
		return signal.DiskFull
	}
	return signal.APIUnreachable
}

// kindOf classifies err; ok is false when it is not an outage.
func kindOf(err error) (Kind, bool) {
	var ae *nodeapi.Error
	if errors.As(err, &ae) {
		return statusKind(ae.Status, ae.Code)
	}
	if IsDiskFull(err) {
		return KindDiskFull, true
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return KindDNS, true
	}
	if k, ok := tlsKind(err); ok {
		return k, true
	}
	if errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "connection refused") {
		return KindRefused, true
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) || (errors.As(err, &ne) && ne.Timeout()) {
		return KindTimeout, true
	}
	return KindUnreachable, true
}

// statusKind classifies an HTTP answer of the control plane.
func statusKind(status int, code string) (Kind, bool) {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return KindAuth, true
	case status == http.StatusTooManyRequests:
		return KindRateLimited, true
	case status == http.StatusUpgradeRequired || strings.Contains(code, "version"):
		return KindProtocol, true
	case status == http.StatusNotFound || status == http.StatusMethodNotAllowed:
		// The node routes always exist; a 404 without an envelope, or the
		// mux's own, is a control plane (or an edge) that does not speak
		// this agent's protocol. A 404 with a domain code (a task the
		// control plane forgot) is not an outage.
		if code == "" || code == "not_found" || code == "route_not_found" || code == "method_not_allowed" {
			return KindProtocol, true
		}
		return "", false
	case status >= 500:
		return KindServer, true
	}
	return "", false
}

// clientCertAlerts are the TLS alerts a server sends when it rejects the
// client's certificate.
func clientCertAlerts() []string {
	return []string{"bad certificate", "certificate required", "unknown certificate authority",
		"certificate revoked", "expired certificate", "unknown certificate", "unsupported certificate", "access denied"}
}

// tlsKind recognises handshake and verification failures.
func tlsKind(err error) (Kind, bool) {
	msg := err.Error()
	if strings.Contains(msg, "remote error: tls: ") {
		for _, a := range clientCertAlerts() {
			if strings.Contains(msg, "remote error: tls: "+a) {
				return KindClientCert, true
			}
		}
		return KindTLS, true
	}
	var (
		verr  *tls.CertificateVerificationError
		uaerr x509.UnknownAuthorityError
		herr  x509.HostnameError
		cierr x509.CertificateInvalidError
		rherr tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &verr), errors.As(err, &uaerr), errors.As(err, &herr), errors.As(err, &cierr), errors.As(err, &rherr):
		return KindTLS, true
	case strings.Contains(msg, "tls: "), strings.Contains(msg, "x509: "):
		return KindTLS, true
	}
	return "", false
}

// IsDiskFull reports whether err is "no space left on device".
func IsDiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || (err != nil && strings.Contains(err.Error(), "no space left on device"))
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// correlationID is the correlation id of an error envelope, if any.
func correlationID(body string) string {
	var eb api.ErrorBody
	if json.Unmarshal([]byte(body), &eb) != nil {
		return ""
	}
	return eb.Error.CorrelationID
}
