package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// testCA is a real CA issuing the test server's certificate.
func testCA(t *testing.T, name string) *pki.CA {
	t.Helper()
	certPEM, keyPEM, err := pki.NewCA(name, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// nodeCert is a node client certificate signed by ca.
func nodeCert(t *testing.T, ca *pki.CA, nodeID string) tls.Certificate {
	t.Helper()
	keyPEM, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CSRFor(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, _, err := ca.SignNodeCSR(csr, nodeID, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsServer serves h over TLS with a certificate for 127.0.0.1 and
// drover.test from ca, requiring client certificates from clientCA when set.
func tlsServer(t *testing.T, ca, clientCA *pki.CA, h http.Handler) *httptest.Server {
	t.Helper()
	cert, err := ca.ServerCertificate([]string{"127.0.0.1", "drover.test"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
	if clientCA != nil {
		srv.TLS.ClientAuth, srv.TLS.ClientCAs = tls.RequireAndVerifyClientCert, clientCA.Pool()
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentListener accepts TCP connections in the kernel but never answers.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestCheckEndpointClassifies: every step's failure on real loopback
// listeners and real TLS classifies into its kind and signal.
func TestCheckEndpointClassifies(t *testing.T) {
	ca, other := testCA(t, "drover test CA"), testCA(t, "another CA")
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, `{"keys":[]}`) })
	plain := tlsServer(t, ca, nil, ok)
	mtls := tlsServer(t, ca, ca, ok)
	good := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{nodeCert(t, ca, "n1")}}
	foreign := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{nodeCert(t, other, "n1")}}
	plainPort := mustURL(t, plain.URL).Port()
	for _, tc := range []struct {
		name, url, resolve string
		tls                *tls.Config
		timeout            time.Duration
		step               string
		kind               Kind
		sig                signal.Name
	}{
		{"passes", plain.URL, "", good, 0, "", "", ""},
		{"resolve address replaces DNS, SNI stays", "https://drover.test:" + plainPort, "127.0.0.1", good, 0, "", "", ""},
		{"dns", "https://drover-preflight.invalid:8443", "", good, 0, StepDNS, KindDNS, signal.APIUnreachable},
		{"refused", "https://" + closedPort(t), "", good, 0, StepTCP, KindRefused, signal.APIUnreachable},
		{"resolve address to a closed port", "https://drover.test:8443", closedPort(t), good, 0, StepTCP, KindRefused, signal.APIUnreachable},
		{"timeout", "https://" + silentListener(t), "", good, 300 * time.Millisecond, StepTLS, KindTimeout, signal.APIUnreachable},
		{"wrong CA", plain.URL, "", &tls.Config{RootCAs: other.Pool()}, 0, StepTLS, KindTLS, signal.APITLSFailed},
		{"wrong host name", "https://localhost:" + plainPort, "", good, 0, StepTLS, KindTLS, signal.APITLSFailed},
		{"client certificate rejected", mtls.URL, "", foreign, 0, StepHTTP, KindClientCert, signal.AuthFailed},
		{"no client certificate", mtls.URL, "", &tls.Config{RootCAs: ca.Pool()}, 0, StepHTTP, KindClientCert, signal.AuthFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 5 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			c := CheckEndpoint(ctx, Endpoint{URL: mustURL(t, tc.url), ResolveAddress: tc.resolve, TLS: tc.tls}, "/x", nil)
			if c.Step != tc.step {
				t.Fatalf("failed step = %q (%v), want %q", c.Step, c.Err, tc.step)
			}
			if tc.step == "" {
				if c.Status != http.StatusOK || c.Address == "" {
					t.Errorf("status %d address %q", c.Status, c.Address)
				}
				return
			}
			f, ok := Classify(c.Err, c.Target)
			if !ok || f.Kind != tc.kind || f.Signal != tc.sig {
				t.Errorf("Classify(%v) = %+v, %v; want kind %s signal %s", c.Err, f, ok, tc.kind, tc.sig)
			}
			if !strings.Contains(f.Detail, string(tc.kind)+": "+c.Target) {
				t.Errorf("detail %q does not name the kind and target", f.Detail)
			}
			if d := c.Data(); d["failed_step"] != tc.step || d["target"] != c.Target {
				t.Errorf("data %v", d)
			}
		})
	}
}

// TestClassifyAnswers: the control plane's answers (through the node API
// client) map to their signals; answers that are not outages do not.
func TestClassifyAnswers(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		kind   Kind
		sig    signal.Name
		detail string
	}{
		{401, "client_certificate_required", KindAuth, signal.AuthFailed, "auth: "},
		{403, "node_identity_revoked", KindAuth, signal.AuthFailed, "identity revoked: "},
		{429, "rate_limited", KindRateLimited, signal.EdgeRateLimited, "rate_limited: "},
		{404, "", KindProtocol, signal.BinaryInvalid, "protocol: "},
		{426, "unsupported_api_version", KindProtocol, signal.BinaryInvalid, "protocol: "},
		{400, "unsupported_api_version", KindProtocol, signal.BinaryInvalid, "protocol: "},
		{503, "unavailable", KindServer, signal.APIUnreachable, "server: "},
		{404, "task_not_found", "", "", ""},
		{409, "conflict", "", "", ""},
		{422, "invalid", "", "", ""},
	} {
		t.Run(fmt.Sprintf("%d %s", tc.status, tc.code), func(t *testing.T) {
			body := fmt.Sprintf(`{"error":{"code":%q,"message":"m","correlation_id":"cid-1"}}`, tc.code)
			err := fmt.Errorf("heartbeat: %w", &nodeapi.Error{Status: tc.status, Body: body})
			var ae *nodeapi.Error
			errors.As(err, &ae)
			ae.Code = tc.code
			f, ok := Classify(err, "cp:8443")
			if ok != (tc.kind != "") || f.Kind != tc.kind || f.Signal != tc.sig {
				t.Fatalf("Classify = %+v, %v; want %s %s", f, ok, tc.kind, tc.sig)
			}
			if ok && (!strings.HasPrefix(f.Detail, tc.detail) || f.CorrelationID != "cid-1") {
				t.Errorf("detail %q cid %q", f.Detail, f.CorrelationID)
			}
		})
	}
	if _, ok := Classify(context.Canceled, "x"); ok {
		t.Error("a cancelled request is not an outage")
	}
	if f, _ := Classify(&os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, "x"); f.Signal != signal.DiskFull {
		t.Errorf("ENOSPC: %+v", f)
	}
}

func TestMatchMachine(t *testing.T) {
	for _, tc := range []struct {
		goarch, machine string
		ok              bool
	}{
		{"amd64", "x86_64", true}, {"arm64", "aarch64", true}, {"amd64", "aarch64", false},
		{"arm64", "x86_64", false}, {"amd64", "weird", true},
	} {
		if ok, detail := MatchMachine(tc.goarch, tc.machine); ok != tc.ok || detail == "" {
			t.Errorf("MatchMachine(%s, %s) = %v %q", tc.goarch, tc.machine, ok, detail)
		}
	}
	if ok, detail := BinaryMatchesHost(); !ok {
		t.Errorf("this test binary does not match its host: %s", detail)
	}
}

func TestUsageAndWritable(t *testing.T) {
	dir := t.TempDir()
	u, err := Usage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.UsedPercent <= 0 || u.UsedPercent > 100 || u.TotalBytes == 0 {
		t.Errorf("usage %+v", u)
	}
	if err := Writable(dir); err != nil {
		t.Errorf("Writable: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("probe file left behind: %v", entries)
	}
}

// TestDiskFullOnTmpfs: on a full filesystem Writable fails with ENOSPC,
// IsDiskFull says so and Usage reads 100%.
func TestDiskFullOnTmpfs(t *testing.T) {
	dir := testutil.FullTmpfs(t, "64k")
	err := Writable(dir)
	if !IsDiskFull(err) {
		t.Fatalf("Writable on a full tmpfs = %v, want ENOSPC", err)
	}
	if u, err := Usage(dir); err != nil || u.UsedPercent < 100 {
		t.Errorf("Usage = %+v, %v; want 100%%", u, err)
	}
}
