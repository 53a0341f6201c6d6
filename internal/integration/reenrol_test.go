package integration

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
)

// pemIdentity is a node key and certificate as the agent stores them.
type pemIdentity struct{ key, cert []byte }

// enrollPEM enrols hostID with token and returns its key and certificate.
func (e *env) enrollPEM(hostID, token string) pemIdentity {
	e.t.Helper()
	key, _ := pki.NewNodeKey()
	csr, _ := pki.CSRFor(key)
	st, body, _ := e.register(api.RegisterRequest{HostID: hostID, BootstrapToken: token, CSRPEM: string(csr), Capabilities: validCaps()})
	if st != http.StatusOK {
		e.t.Fatalf("enroll %s: HTTP %d: %s", hostID, st, body)
	}
	var ident api.Identity
	if err := json.Unmarshal(body, &ident); err != nil {
		e.t.Fatal(err)
	}
	return pemIdentity{key: key, cert: []byte(ident.CertificatePEM)}
}

// reenrolRequest is hostID's registration with a new CSR and a proof by
// signer's key of prev's certificate, signed at at.
func reenrolRequest(t *testing.T, hostID string, prev, signer pemIdentity, at time.Time) (api.RegisterRequest, []byte) {
	t.Helper()
	key, _ := pki.NewNodeKey()
	csr, _ := pki.CSRFor(key)
	sig, err := pki.SignReenrol(signer.key, hostID, csr, at)
	if err != nil {
		t.Fatal(err)
	}
	return api.RegisterRequest{HostID: hostID, CSRPEM: string(csr), Capabilities: validCaps(),
		PreviousCertificate: &api.CertificateProof{CertificatePEM: string(prev.cert), SignedAt: at, Signature: sig}}, key
}

// TestReenrolWithPreviousCertificate: an expired certificate, the last one
// of its host, enrols the host again by proof of its key, and nothing
// else does: another host's or another CA's certificate, another key's
// signature, a signature of another CSR, a stale proof, a certificate
// renewed or enrolled since, a revoked or disabled host, a certificate
// past the grace.
func TestReenrolWithPreviousCertificate(t *testing.T) {
	generous := func(c *server.Config) {
		c.CertTTL = 2 * time.Second
		c.RegisterRate, c.RegisterBurst, c.AuthFailRate, c.AuthFailBurst = rate.Inf, 1000, rate.Inf, 1000
	}
	e := startEnv(t, openSQLite(t), generous)
	ids := map[string]pemIdentity{}
	for _, h := range []string{"node-a", "node-b", "node-r", "node-d", "node-n"} {
		ids[h] = e.enrollPEM(h, e.createHost(h).Token)
	}
	// node-n renews while its first certificate is valid: that one is no
	// longer the host's last.
	first := ids["node-n"]
	renewCSRKey, _ := pki.NewNodeKey()
	renewCSR, _ := pki.CSRFor(renewCSRKey)
	firstPair, _ := tls.X509KeyPair(first.cert, first.key)
	if st, code, _ := e.nodeCall(e.rawClient(&firstPair), http.MethodPost, nodePath("node-n", "/renew"),
		api.RenewRequest{CSRPEM: string(renewCSR)}); st != http.StatusOK {
		t.Fatalf("renew node-n: %d %s", st, code)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-r/revoke", nil, nil); st != http.StatusOK {
		t.Fatalf("revoke: HTTP %d", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/hosts/node-d/disable", nil, nil); st != http.StatusOK {
		t.Fatalf("disable: HTTP %d", st)
	}
	foreign := startEnv(t, openSQLite(t), generous)
	other := foreign.enrollPEM("node-a", foreign.createHost("node-a").Token)
	time.Sleep(2100 * time.Millisecond) // every certificate above expired

	now := time.Now()
	a, b := ids["node-a"], ids["node-b"]
	signedOther := func() api.RegisterRequest { // a signature of another CSR
		req, _ := reenrolRequest(t, "node-a", a, a, now)
		other, _ := reenrolRequest(t, "node-a", a, a, now)
		req.CSRPEM = other.CSRPEM
		return req
	}
	for _, tc := range []struct {
		name   string
		req    api.RegisterRequest
		status int
		code   string
	}{
		{"another host's certificate", reqOnly(reenrolRequest(t, "node-a", b, b, now)), http.StatusUnauthorized, "previous_certificate_invalid"},
		{"another key's signature", reqOnly(reenrolRequest(t, "node-a", a, b, now)), http.StatusUnauthorized, "previous_certificate_invalid"},
		{"another CA's certificate", reqOnly(reenrolRequest(t, "node-a", other, other, now)), http.StatusUnauthorized, "previous_certificate_invalid"},
		{"a signature of another CSR", signedOther(), http.StatusUnauthorized, "previous_certificate_invalid"},
		{"a stale proof", reqOnly(reenrolRequest(t, "node-a", a, a, now.Add(-10*time.Minute))), http.StatusUnauthorized, "previous_certificate_proof_stale"},
		{"a certificate renewed since", reqOnly(reenrolRequest(t, "node-n", first, first, now)), http.StatusUnauthorized, "previous_certificate_superseded"},
		{"a revoked host", reqOnly(reenrolRequest(t, "node-r", ids["node-r"], ids["node-r"], now)), http.StatusForbidden, "host_revoked"},
		{"a disabled host", reqOnly(reenrolRequest(t, "node-d", ids["node-d"], ids["node-d"], now)), http.StatusForbidden, "host_disabled"},
	} {
		st, body, _ := e.register(tc.req)
		var eb api.ErrorBody
		_ = json.Unmarshal(body, &eb)
		if st != tc.status || eb.Error.Code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, st, body, tc.status, tc.code)
		}
	}
	withToken, _ := reenrolRequest(t, "node-a", a, a, now)
	withToken.BootstrapToken = "drv_bt_x"
	if st, body, _ := e.register(withToken); st != http.StatusUnprocessableEntity || !strings.Contains(string(body), "previous_certificate") {
		t.Errorf("token and certificate: %d %s", st, body)
	}
	if !e.auditHas("host.register", "node-a", "previous_certificate_invalid") {
		t.Error("refused proof not audited")
	}

	// The real thing: a new certificate that works, audited; the same
	// request again is refused (its certificate is no longer the last).
	req, key := reenrolRequest(t, "node-a", a, a, time.Now())
	st, body, _ := e.register(req)
	if st != http.StatusOK {
		t.Fatalf("re-enrol: %d %s", st, body)
	}
	var ident api.Identity
	if err := json.Unmarshal(body, &ident); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair([]byte(ident.CertificatePEM), key)
	if err != nil {
		t.Fatal(err)
	}
	if st, code, _ := e.nodeCall(e.rawClient(&pair), http.MethodPost, nodePath("node-a", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("heartbeat with the new certificate: %d %s", st, code)
	}
	if !e.auditHas("host.register", "node-a", "ok") {
		t.Error("re-enrolment not audited")
	}
	if st, body, _ := e.register(req); st != http.StatusUnauthorized || !strings.Contains(string(body), "previous_certificate_superseded") {
		t.Errorf("replayed re-enrolment: %d %s", st, body)
	}

	// Past the grace, or with the grace off.
	graces := map[string]time.Duration{"previous_certificate_too_old": 500 * time.Millisecond, "previous_certificate_disabled": -1}
	envs, gids := map[string]*env{}, map[string]pemIdentity{}
	for code, grace := range graces {
		envs[code] = startEnv(t, openSQLite(t), generous, func(c *server.Config) { c.CertReenrolGrace = grace })
		gids[code] = envs[code].enrollPEM("node-g", envs[code].createHost("node-g").Token)
	}
	time.Sleep(2600 * time.Millisecond)
	for code, g := range envs {
		req, _ := reenrolRequest(t, "node-g", gids[code], gids[code], time.Now())
		if st, body, _ := g.register(req); st != http.StatusUnauthorized || !strings.Contains(string(body), code) {
			t.Errorf("grace %s: %d %s, want 401 %s", graces[code], st, body, code)
		}
	}
}

// reqOnly is a request without its key.
func reqOnly(req api.RegisterRequest, _ []byte) api.RegisterRequest { return req }

// reenrolments counts hostID's enrolments by a previous certificate.
func (e *env) reenrolments(hostID string) int {
	var evs []api.AuditEvent
	e.op(http.MethodGet, "/api/v1/audit?limit=1000&action=host.register&target="+hostID, nil, &evs)
	n := 0
	for _, ev := range evs {
		if ev.Result == "ok" && strings.Contains(ev.Detail, "credential=previous_certificate") {
			n++
		}
	}
	return n
}

// waitReenrolments waits until hostID has n enrolments by a previous
// certificate.
func (e *env) waitReenrolments(hostID string, n int, within time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for e.reenrolments(hostID) < n {
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %d enrolments by its previous certificate after %s, want %d", hostID, e.reenrolments(hostID), within, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAgentEnrolsAgainAfterItsCertificateExpired: a running agent whose
// certificate expired while the control plane was away, and an agent
// started with an expired certificate and no bootstrap token (its token
// was used up by the first enrolment), both come back on their own, by
// proof of their last certificate's key.
func TestAgentEnrolsAgainAfterItsCertificateExpired(t *testing.T) {
	st := openSQLite(t)
	ttl := func(c *server.Config) { c.CertTTL = 4 * time.Second }
	e := startEnv(t, st, ttl)
	dir := t.TempDir()
	_, stop := e.startAgent("node-x", e.createHost("node-x").Token, agentOpts{stateDir: dir})
	e.waitHostStatus("node-x", api.HostHealthy, 10*time.Second)

	opAddr, nodeAddr := strings.TrimPrefix(e.opURL, "http://"), strings.TrimPrefix(e.nodeURL, "https://")
	e.stop()
	e.stop = nil
	time.Sleep(5 * time.Second) // longer than the certificate lives
	e = startEnvAt(t, st, opAddr, nodeAddr, ttl)
	e.waitReenrolments("node-x", 1, 30*time.Second)
	e.waitHostStatus("node-x", api.HostHealthy, 10*time.Second)

	stop()
	time.Sleep(4500 * time.Millisecond)
	e.startAgent("node-x", "", agentOpts{stateDir: dir})
	e.waitReenrolments("node-x", 2, 30*time.Second)
	e.waitHostStatus("node-x", api.HostHealthy, 10*time.Second)
}
