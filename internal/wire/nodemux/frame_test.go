package nodemux

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"runtime"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	h := http.Header{"Content-Type": {"application/json"}, "If-Match": {`"a"`, `"b"`}}
	frame := AppendRequest(nil, 7, "POST", "/internal/v1/nodes/n/heartbeat?x=1", h, []byte(`{"a":1}`))
	var hdr [HeaderLen]byte
	f, err := ReadFrame(bytes.NewReader(frame), &hdr, MaxPayload)
	if err != nil || f.Type != TypeRequest || f.Stream != 7 {
		t.Fatalf("frame %+v %v", f, err)
	}
	r, err := ParseRequest(f.Payload)
	if err != nil || r.Method != "POST" || r.Target != "/internal/v1/nodes/n/heartbeat?x=1" ||
		!reflect.DeepEqual(r.Header, h) || string(r.Body) != `{"a":1}` {
		t.Fatalf("request %+v %v", r, err)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	h := http.Header{"Etag": {`"x"`}}
	frame := AppendResponse(nil, 3, 204, h, nil)
	var hdr [HeaderLen]byte
	f, err := ReadFrame(bytes.NewReader(frame), &hdr, MaxPayload)
	if err != nil || f.Type != TypeResponse || f.Stream != 3 {
		t.Fatalf("frame %+v %v", f, err)
	}
	r, err := ParseResponse(f.Payload)
	if err != nil || r.Status != 204 || !reflect.DeepEqual(r.Header, h) || len(r.Body) != 0 {
		t.Fatalf("response %+v %v", r, err)
	}
}

// TestParseRefuses: what breaks the encoding is ErrProtocol, never a
// panic or a request with a smuggled field.
func TestParseRefuses(t *testing.T) {
	req := func(method, target string, h http.Header) []byte {
		return AppendRequest(nil, 1, method, target, h, nil)[HeaderLen:]
	}
	many := http.Header{}
	for i := range MaxFields + 1 {
		many.Add("X-F", string(rune('a'+i%26)))
	}
	for name, p := range map[string][]byte{
		"empty":            {},
		"method not token": req("GE T", "/", nil),
		"empty method":     req("", "/", nil),
		"absolute target":  req("GET", "https://x/", nil),
		"target CRLF":      req("GET", "/a\r\nb", nil),
		"target space":     req("GET", "/a b", nil),
		"field name":       req("GET", "/", http.Header{"Bad Name": {"v"}}),
		"field CRLF":       req("GET", "/", http.Header{"X": {"a\r\nInjected: 1"}}),
		"field NUL":        req("GET", "/", http.Header{"X": {"a\x00"}}),
		"too many fields":  req("GET", "/", many),
		"truncated":        req("GET", "/long/target", nil)[:6],
		"length overflow":  {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		if _, err := ParseRequest(p); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
	for name, p := range map[string][]byte{"empty": {}, "status 99": {99, 0}, "status 1000": {0xe8, 0x07, 0}} {
		if _, err := ParseResponse(p); !errors.Is(err, ErrProtocol) {
			t.Errorf("answer %s: %v, want ErrProtocol", name, err)
		}
	}
	var hdr [HeaderLen]byte
	if _, err := ReadFrame(bytes.NewReader(AppendHeader(nil, TypeRequest, 1, 11)), &hdr, 10); !errors.Is(err, ErrProtocol) {
		t.Errorf("frame over max: %v", err)
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(AppendRequest(nil, 1, "GET", "/x?y=1", http.Header{"A": {"b"}}, []byte("body"))[HeaderLen:])
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := ParseRequest(p)
		if err != nil {
			return
		}
		if !validToken(r.Method) || len(r.Target) == 0 || r.Target[0] != '/' {
			t.Fatalf("accepted %+v", r)
		}
		for k, vs := range r.Header {
			for _, v := range vs {
				if !validToken(k) || !validValue(v) {
					t.Fatalf("accepted field %q: %q", k, v)
				}
			}
		}
	})
}

// TestReadPayloadGrowsAsBytesArrive: a header claiming MaxPayload followed
// by a few bytes costs the reader about what arrived, not MaxPayload, and
// fails as a truncated frame.
func TestReadPayloadGrowsAsBytesArrive(t *testing.T) {
	in := append(AppendHeader(nil, TypeRequest, 1, MaxPayload), "only this"...)
	var hdr [HeaderLen]byte
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadFrame(bytes.NewReader(in), &hdr, MaxPayload)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated payload: %v, want io.ErrUnexpectedEOF", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Fatalf("allocated %d bytes for a 9-byte header and 9 bytes of payload", got)
	}
	// A whole large payload still arrives whole.
	big := bytes.Repeat([]byte("x"), 3*payloadChunk+5)
	f, err := ReadFrame(bytes.NewReader(append(AppendHeader(nil, TypeRequest, 2, len(big)), big...)), &hdr, MaxPayload)
	if err != nil || !bytes.Equal(f.Payload, big) {
		t.Fatalf("large payload: %d bytes, %v", len(f.Payload), err)
	}
}

// TestParseRequestAllocations: a heartbeat's request frame (a few fields)
// decodes with a fixed, small number of allocations: the fields' map,
// one string for every name and value, one array for the values, and the
// target; the method is not copied.
func TestParseRequestAllocations(t *testing.T) {
	h := http.Header{"If-Match": {`"0123456789abcdef0123456789abcdef"`}, "Prefer": {"return=minimal"},
		"X-Correlation-Id": {"cid_0123456789abcdef"}, "Content-Type": {"application/json"}}
	p := AppendRequest(nil, 1, "POST", "/internal/v1/nodes/n/heartbeat", h, nil)[HeaderLen:]
	var r Request
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if r, err = ParseRequest(p); err != nil {
			t.Fatal(err)
		}
	})
	if !reflect.DeepEqual(r.Header, h) || r.Method != http.MethodPost {
		t.Fatalf("parsed %+v", r)
	}
	if allocs > 5 {
		t.Errorf("%v allocations to decode a request with %d fields, want at most 5", allocs, len(h))
	}
}
