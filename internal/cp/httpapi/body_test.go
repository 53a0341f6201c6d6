package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

func TestAppendBody(t *testing.T) {
	big := bytes.Repeat([]byte("x"), MaxBody+10)
	for _, tc := range []struct {
		name string
		body io.Reader
		dst  []byte
		want int
		err  bool
	}{
		{"empty", strings.NewReader(""), nil, 0, false},
		{"small into nil", strings.NewReader(`{"a":1}`), nil, 7, false},
		{"small into reused", strings.NewReader(`{"a":1}`), make([]byte, 3, 4), 7, false},
		{"bounded by MaxBody", bytes.NewReader(big), make([]byte, 0, 512), MaxBody, false},
		{"read error", io.MultiReader(strings.NewReader("{"), errReader{}), nil, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AppendBody(tc.dst[:0], tc.body)
			if len(got) != tc.want || (err != nil) != tc.err {
				t.Fatalf("AppendBody: %d bytes, err %v; want %d bytes, error %v", len(got), err, tc.want, tc.err)
			}
			var he *Error
			if err != nil && (!errors.As(err, &he) || he.Code != "invalid_json") {
				t.Fatalf("error %v, want invalid_json", err)
			}
		})
	}
	small := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() {
		_, _ = AppendBody(small[:0], strings.NewReader(`{"agent_version":"1"}`))
	}); n > 1 { // the strings.Reader
		t.Errorf("AppendBody into a reused buffer: %v allocations", n)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestDecodeJSONBytes(t *testing.T) {
	var v struct {
		A int `json:"a"`
	}
	if err := DecodeJSONBytes([]byte(`{"a":2}`), &v); err != nil || v.A != 2 {
		t.Fatalf("decode: %v %+v", err, v)
	}
	for _, bad := range []string{`{"a":2,"b":1}`, `{`, ``} { // strict, like DecodeJSON
		var he *Error
		if err := DecodeJSONBytes([]byte(bad), &v); !errors.As(err, &he) || he.Code != "invalid_json" {
			t.Errorf("%q: %v, want invalid_json", bad, err)
		}
	}
}

func TestNewIDShape(t *testing.T) {
	re := regexp.MustCompile(`^cid_[0-9a-f]{24}$`)
	a, b := NewID("cid_"), NewID("cid_")
	if !re.MatchString(a) || a == b {
		t.Fatalf("ids %q %q", a, b)
	}
	if long := NewID(strings.Repeat("p", 100)); len(long) != 124 {
		t.Fatalf("long prefix: %q", long)
	}
}

func TestWithCorrelation(t *testing.T) {
	if got := http.CanonicalHeaderKey(api.HeaderCorrelationID); got != correlationHeaderKey {
		t.Fatalf("canonical %q, constant %q", got, correlationHeaderKey)
	}
	type key struct{}
	var seen string
	h := WithCorrelation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = CorrelationID(r.Context())
		if r.Context().Value(key{}) != "outer" { // other values still reach through
			t.Error("outer context value lost")
		}
	}))
	for _, tc := range []struct{ in, want string }{{"cid-agent-1", "cid-agent-1"}, {"bad id", ""}, {"", ""}} {
		r := httptest.NewRequestWithContext(context.WithValue(t.Context(), key{}, "outer"), "GET", "/", nil)
		if tc.in != "" {
			r.Header.Set(api.HeaderCorrelationID, tc.in)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		echoed := w.Header().Get(api.HeaderCorrelationID)
		if echoed == "" || echoed != seen || (tc.want != "" && seen != tc.want) || (tc.want == "" && !strings.HasPrefix(seen, "cid_")) {
			t.Errorf("in %q: context %q, echoed %q", tc.in, seen, echoed)
		}
	}
	if CorrelationID(t.Context()) != "" {
		t.Error("correlation id outside a request")
	}
}

// TestCorrelatedRequestNotCopied: a request whose context Correlated made
// (as the node listener's framed connections do) reaches the handler under
// WithCorrelation as it is, with the id of its header field, echoed once
// on the writer it was made for and on any other writer it is served to.
func TestCorrelatedRequestNotCopied(t *testing.T) {
	var got *http.Request
	h := WithCorrelation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r }))
	for _, tc := range []struct {
		name, in   string
		sameWriter bool
	}{{"its writer", "cid-agent-1", true}, {"another writer", "cid-agent-2", false}, {"malformed id", "bad id", true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			resp := w.Header()
			if !tc.sameWriter {
				resp = http.Header{}
			}
			req := http.Header{correlationHeaderKey: {tc.in}}
			r := httptest.NewRequestWithContext(Correlated(t.Context(), req, resp), "GET", "/", nil)
			r.Header = req
			h.ServeHTTP(w, r)
			if got != r {
				t.Fatal("the handler got a copy of the request")
			}
			cid := CorrelationID(got.Context())
			if (tc.in == "bad id") != strings.HasPrefix(cid, "cid_") || (tc.in != "bad id" && cid != tc.in) {
				t.Fatalf("correlation id %q for header %q", cid, tc.in)
			}
			if echoed := w.Header()[correlationHeaderKey]; len(echoed) != 1 || echoed[0] != cid {
				t.Fatalf("echoed %q, want [%s]", echoed, cid)
			}
		})
	}
}
