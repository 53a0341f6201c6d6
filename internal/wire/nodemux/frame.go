// Package nodemux carries the node API's requests and answers over one
// mTLS connection per agent without HTTP/2: the agent offers ALPN
// protocol Proto, and a control plane that speaks it reads frames from the
// connection on one small goroutine instead of net/http's three per
// parked long-poll (docs/adr/0018-node-mux.md). Both sides share this
// package: the framing, the request and answer encoding, and the agent's
// http.RoundTripper (Transport).
//
// A frame is a 9-byte header (payload length, uint32 big-endian; type;
// stream id, uint32 big-endian) and its payload. The agent numbers its
// requests; the control plane answers each stream once. A request frame
// carries the method, the target, the header fields and the whole body; an
// answer frame the status, the header fields and the whole body; a cancel
// frame (no payload) ends a request the agent no longer waits for, so its
// handler's context ends as a closed HTTP/2 stream's would.
package nodemux

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strings"
)

// Proto is the ALPN protocol name of this framing.
const Proto = "drover-mux/1"

// Frame types.
const (
	TypeRequest  byte = 1
	TypeResponse byte = 2
	TypeCancel   byte = 3
)

// HeaderLen is the length of a frame header.
const HeaderLen = 9

// MaxPayload bounds a frame's payload on both sides. Transport sends a
// request body over MaxPayload/2 by HTTP/2 instead, and the control plane
// answers 500 response_too_large for an answer that does not fit. The node
// API's bodies are far smaller (a results batch is at most 1 MiB).
const MaxPayload = 8 << 20

// MaxFields bounds the header fields of one request or answer.
const MaxFields = 64

// ErrProtocol is a frame or an encoding that breaks this framing; the
// connection it came from is closed.
var ErrProtocol = errors.New("nodemux: protocol error")

// Frame is one frame read from a connection.
type Frame struct {
	Type    byte
	Stream  uint32
	Payload []byte
}

// ReadFrame reads one frame from r. hdr is scratch space for the header
// (so a reader's loop allocates only payloads). A payload above max is
// ErrProtocol.
func ReadFrame(r io.Reader, hdr *[HeaderLen]byte, max int) (Frame, error) {
	f, n, err := ReadHeader(r, hdr, max)
	if err != nil {
		return Frame{}, err
	}
	return f, ReadPayload(r, &f, n)
}

// ReadHeader reads a frame's header: its type, stream and payload length
// (above max: ErrProtocol).
func ReadHeader(r io.Reader, hdr *[HeaderLen]byte, max int) (Frame, int, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, 0, err
	}
	return ParseHeader(hdr, max)
}

// ParseHeader is a frame header read by the caller: the frame, without its
// payload, and the payload's length (at most max).
func ParseHeader(hdr *[HeaderLen]byte, max int) (Frame, int, error) {
	n := binary.BigEndian.Uint32(hdr[0:4])
	if int64(n) > int64(max) {
		return Frame{}, 0, fmt.Errorf("%w: frame of %d bytes (at most %d)", ErrProtocol, n, max)
	}
	return Frame{Type: hdr[4], Stream: binary.BigEndian.Uint32(hdr[5:9])}, int(n), nil
}

// ReadPayload reads the n bytes of f's payload that follow its header. A
// large payload's buffer grows as its bytes arrive: a header alone, which
// costs a peer 9 bytes, never makes the reader allocate MaxPayload.
func ReadPayload(r io.Reader, f *Frame, n int) error {
	switch {
	case n <= 0:
		return nil
	case n <= payloadChunk:
		f.Payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return fmt.Errorf("nodemux: frame payload: %w", err)
		}
	default:
		b := bytes.NewBuffer(make([]byte, 0, payloadChunk))
		if _, err := io.CopyN(b, r, int64(n)); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("nodemux: frame payload: %w", err)
		}
		f.Payload = b.Bytes()
	}
	return nil
}

// payloadChunk is the largest payload allocated whole before it arrives.
const payloadChunk = 64 << 10

// AppendHeader appends a frame header for a payload of n bytes.
func AppendHeader(b []byte, typ byte, stream uint32, n int) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	b = append(b, typ)
	return binary.BigEndian.AppendUint32(b, stream)
}

// AppendRequest appends a whole request frame: header, method, target,
// fields, body.
func AppendRequest(b []byte, stream uint32, method, target string, h http.Header, body []byte) []byte {
	start := len(b)
	b = AppendHeader(b, TypeRequest, stream, 0)
	b = appendString(b, method)
	b = appendString(b, target)
	b = appendFields(b, h)
	b = append(b, body...)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-HeaderLen))
	return b
}

// AppendResponse appends a whole answer frame: header, status, fields,
// body.
func AppendResponse(b []byte, stream uint32, status int, h http.Header, body []byte) []byte {
	start := len(b)
	b = AppendHeader(b, TypeResponse, stream, 0)
	b = binary.AppendUvarint(b, uint64(status))
	b = appendFields(b, h)
	b = append(b, body...)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-HeaderLen))
	return b
}

// Request is a request frame's payload, decoded.
type Request struct {
	Method, Target string
	Header         http.Header
	Body           []byte
}

// ParseRequest decodes a request frame's payload. The method must be a
// token, the target an origin-form path ("/..."), each field name a token
// and each value free of control characters other than tab.
func ParseRequest(p []byte) (Request, error) {
	var r Request
	var err error
	if r.Method, p, err = readMethod(p); err != nil || !validToken(r.Method) {
		return Request{}, fmt.Errorf("%w: request method", ErrProtocol)
	}
	if r.Target, p, err = readString(p); err != nil || !strings.HasPrefix(r.Target, "/") || !validValue(r.Target) ||
		strings.ContainsAny(r.Target, " \t") {
		return Request{}, fmt.Errorf("%w: request target", ErrProtocol)
	}
	if r.Header, p, err = readFields(p); err != nil {
		return Request{}, err
	}
	r.Body = p
	return r, nil
}

// Response is an answer frame's payload, decoded.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// ParseResponse decodes an answer frame's payload.
func ParseResponse(p []byte) (Response, error) {
	status, n := binary.Uvarint(p)
	if n <= 0 || status < 100 || status > 999 {
		return Response{}, fmt.Errorf("%w: answer status", ErrProtocol)
	}
	h, rest, err := readFields(p[n:])
	if err != nil {
		return Response{}, err
	}
	return Response{Status: int(status), Header: h, Body: rest}, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// readMethod is readString for a request's method, with no copy of the
// methods the node API uses.
func readMethod(p []byte) (string, []byte, error) {
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)-k) {
		return "", nil, fmt.Errorf("%w: truncated string", ErrProtocol)
	}
	switch m := p[k : k+int(n)]; string(m) {
	case http.MethodGet:
		return http.MethodGet, p[k+int(n):], nil
	case http.MethodPost:
		return http.MethodPost, p[k+int(n):], nil
	case http.MethodPut:
		return http.MethodPut, p[k+int(n):], nil
	case http.MethodDelete:
		return http.MethodDelete, p[k+int(n):], nil
	}
	return readString(p)
}

func readString(p []byte) (string, []byte, error) {
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)-k) {
		return "", nil, fmt.Errorf("%w: truncated string", ErrProtocol)
	}
	return string(p[k : k+int(n)]), p[k+int(n):], nil
}

func appendFields(b []byte, h http.Header) []byte {
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	b = binary.AppendUvarint(b, uint64(n))
	for k, vs := range h {
		for _, v := range vs {
			b = appendString(b, k)
			b = appendString(b, v)
		}
	}
	return b
}

// readFields decodes a frame's header fields. Every name and value is a
// substring of one string, and the values sit in one array, so a request's
// fields cost three allocations however many there are (the map, the
// string, the array) instead of three each: a heartbeat's frames are read
// tens of thousands of times a second.
func readFields(p []byte) (http.Header, []byte, error) {
	n, k := binary.Uvarint(p)
	if k <= 0 || n > MaxFields {
		return nil, nil, fmt.Errorf("%w: header field count", ErrProtocol)
	}
	p = p[k:]
	end := 0 // where the fields end
	for range 2 * n {
		l, k := binary.Uvarint(p[end:])
		if k <= 0 || l > uint64(len(p)-end-k) {
			return nil, nil, fmt.Errorf("%w: truncated header field", ErrProtocol)
		}
		end += k + int(l)
	}
	text := string(p[:end])
	h := make(http.Header, n)
	values := make([]string, n)
	off := 0
	for i := range n {
		var name, value string
		name, off = fieldAt(p, text, off)
		if !validToken(name) {
			return nil, nil, fmt.Errorf("%w: header field name", ErrProtocol)
		}
		if value, off = fieldAt(p, text, off); !validValue(value) {
			return nil, nil, fmt.Errorf("%w: header field %s", ErrProtocol, name)
		}
		key := textproto.CanonicalMIMEHeaderKey(name) // name itself when canonical
		if vs, ok := h[key]; ok {
			h[key] = append(vs, value)
		} else {
			values[i] = value
			h[key] = values[i : i+1 : i+1]
		}
	}
	return h, p[end:], nil
}

// fieldAt is the length-prefixed string at off in p, as a substring of
// text (p's bytes from the start, as a string), and the offset after it;
// readFields has checked that p holds it whole.
func fieldAt(p []byte, text string, off int) (string, int) {
	l, k := binary.Uvarint(p[off:])
	start := off + k
	return text[start : start+int(l)], start + int(l)
}

// validToken: RFC 9110 token characters.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validValue: no control characters but tab (no CR, LF or NUL).
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
