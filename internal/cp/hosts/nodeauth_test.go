package hosts

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// parkRecorder is a ResponseWriter of a transport that parks requests; done
// is closed when a parked request finishes.
type parkRecorder struct {
	*httptest.ResponseRecorder
	p    *httpapi.Park
	done chan struct{}
}

func newParkRecorder() *parkRecorder {
	w := &parkRecorder{ResponseRecorder: httptest.NewRecorder(), done: make(chan struct{})}
	w.p = httpapi.NewPark(func() { close(w.done) }, func(v any) { panic(v) })
	return w
}

func (w *parkRecorder) Park() *httpapi.Park { return w.p }

// TestNodeAuthIDParked: NodeAuthID writes nothing for a request its
// handler parked, and, as the top of its chain, writes the error the
// request finishes with then (nothing for nil).
func TestNodeAuthIDParked(t *testing.T) {
	rs := newReplicas(t, "n1")
	s := rs.room()
	now := rs.clock.Now()
	cert := &x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, URIs: []*url.URL{pki.NodeURI("n1")},
		NotBefore: now.Add(-pki.Backdate), NotAfter: now.Add(time.Hour)}
	for _, tc := range []struct {
		name        string
		finishErr   error
		finishEarly bool // Finish before the handler returned (an event as it parked)
		wantStatus  int  // 0: nothing written
		wantCode    string
	}{
		{"finished with an answer written", nil, false, 0, ""},
		{"finished with an error", httpapi.Errorf(http.StatusForbidden, "node_identity_revoked", "node identity revoked"),
			false, http.StatusForbidden, "node_identity_revoked"},
		{"finished with an internal error", errors.New("store down"), false, http.StatusInternalServerError, "internal"},
		{"finished as it parked", httpapi.Errorf(http.StatusForbidden, "node_identity_revoked", "node identity revoked"),
			true, http.StatusForbidden, "node_identity_revoked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var parked *httpapi.Park
			h := s.NodeAuthID(func(w http.ResponseWriter, r *http.Request, nodeID string) error {
				if nodeID != "n1" {
					t.Errorf("node %q", nodeID)
				}
				parked = w.(httpapi.Parker).Park()
				if tc.finishEarly {
					parked.Finish(tc.finishErr)
				}
				return parked.Err()
			})
			r := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/internal/v1/nodes/n1/tasks/wait", nil)
			r.SetPathValue("id", "n1")
			r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
			w := newParkRecorder()
			h.ServeHTTP(w, r)
			if parked == nil {
				t.Fatalf("the handler did not run: %d %s", w.Code, w.Body)
			}
			if !tc.finishEarly {
				if w.Body.Len() != 0 || len(w.Header()) != 0 {
					t.Fatalf("written on return of a parked request: %d %v %q", w.Code, w.Header(), w.Body)
				}
				select {
				case <-w.done:
					t.Fatal("the request finished before Finish")
				default:
				}
				parked.Finish(tc.finishErr)
			}
			select {
			case <-w.done:
			case <-time.After(5 * time.Second):
				t.Fatal("the parked request did not end")
			}
			if tc.wantStatus == 0 {
				if w.Body.Len() != 0 {
					t.Fatalf("written for a nil error: %d %q", w.Code, w.Body)
				}
				return
			}
			var body api.ErrorBody
			if w.Code != tc.wantStatus || json.Unmarshal(w.Body.Bytes(), &body) != nil || body.Error.Code != tc.wantCode {
				t.Fatalf("answer %d %q, want %d %s", w.Code, w.Body, tc.wantStatus, tc.wantCode)
			}
		})
	}
}
