package agent

import (
	"context"
	"crypto/x509"
	"net/http"
	"sync"
	"testing"

	"github.com/drover-dev/drover/internal/wire/nodemux"
)

// TestClientTLSConfigNotSharedWithTransport: the HTTP/2 fallback
// transport's first request (which writes its TLS configuration's
// NextProtos) and the framed connection's dial (which clones the client's)
// touch no common configuration: under -race a shared one is reported.
// The agent hit it when the control plane came back and both paths
// dialled at once.
func TestClientTLSConfigNotSharedWithTransport(t *testing.T) {
	c, err := newClient("https://127.0.0.1:1", nil, func([][]byte, [][]*x509.Certificate) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	mux, ok := c.http.Transport.(*nodemux.Transport)
	if !ok {
		t.Fatalf("transport %T, want the framed one", c.http.Transport)
	}
	tr := mux.Fallback.(*oneDial).next.(*http.Transport)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://127.0.0.1:1/", nil)
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}()
	_ = c.tlsConfig()
	wg.Wait()
}
