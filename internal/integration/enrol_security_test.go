package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
)

func newCSR(t *testing.T) string {
	t.Helper()
	k, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.CSRFor(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(c)
}

// regReq is a well-formed registration of id with token.
func regReq(t *testing.T, id, token string) api.RegisterRequest {
	return api.RegisterRequest{HostID: id, BootstrapToken: token, CSRPEM: newCSR(t), Capabilities: validCaps()}
}

// registerFrom posts a registration from the loopback address local
// (127.0.0.2, ...), i.e. from another client address.
func (e *env) registerFrom(local string, req api.RegisterRequest) (int, []byte, http.Header) {
	e.t.Helper()
	c := e.rawClient(nil)
	tr := c.Transport.(*http.Transport)
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).DialContext
	b, _ := json.Marshal(req)
	resp, err := c.Post(e.nodeURL+"/internal/v1/register", "application/json", bytes.NewReader(b))
	if err != nil {
		e.t.Fatalf("register from %s: %v", local, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, resp.Header
}

func errCode(t *testing.T, body []byte) string {
	t.Helper()
	var eb api.ErrorBody
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	return eb.Error.Code
}

// auditDetails returns the details of the audit records of target that
// match action and result.
func (e *env) auditDetails(action, target, result string) []string {
	var evs []api.AuditEvent
	e.op(http.MethodGet, "/api/v1/audit?limit=1000&target="+target, nil, &evs)
	var out []string
	for _, ev := range evs {
		if ev.Action == action && ev.Result == result {
			out = append(out, ev.Detail)
		}
	}
	return out
}

// TestUnknownHostRegistrationCannotHijack: with unknown-host registration
// on, re-registering an enrolled host id without a valid token is refused
// and the enrolled identity keeps working; only ids without a record enrol
// token-less, audited with their source address.
func TestUnknownHostRegistrationCannotHijack(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) {
		c.AllowUnknownHostRegistration = true
		c.RegisterRate, c.RegisterBurst = rate.Inf, 1000
	})
	victim := e.enroll("victim", e.createHost("victim").Token)
	var before api.Host
	e.op(http.MethodGet, "/api/v1/hosts/victim", nil, &before)

	pending := e.createHost("pending")       // a record with a token, never enrolled
	auto := e.enroll("auto-1", "drv_bt_any") // enrolled by unknown-host registration
	for _, id := range []string{"victim", "auto-1", "pending"} {
		// An absent token is a field error (the seed's contract), for any id.
		if st, body, _ := e.register(regReq(t, id, "")); st != http.StatusUnprocessableEntity || errCode(t, body) != "invalid_payload" {
			t.Fatalf("re-register %s without a token: %d %s, want 422", id, st, body)
		}
		for _, tok := range []string{"drv_bt_guess", "x"} {
			st, body, _ := e.register(regReq(t, id, tok))
			if st != http.StatusUnauthorized || errCode(t, body) != "bootstrap_token_invalid" {
				t.Fatalf("re-register %s with token %q: %d %s, want 401 bootstrap_token_invalid", id, tok, st, body)
			}
		}
	}
	for _, n := range []nodeIdentity{victim, auto} {
		if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath(n.id, "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
			t.Fatalf("%s's identity after the attempts: %d %s", n.id, st, body)
		}
	}
	var after api.Host
	e.op(http.MethodGet, "/api/v1/hosts/victim", nil, &after)
	if !after.CertNotAfter.Equal(*before.CertNotAfter) {
		t.Fatalf("victim's certificate changed: %v → %v", before.CertNotAfter, after.CertNotAfter)
	}
	// The pending host still enrols with its own token.
	e.enroll("pending", pending.Token)

	fresh := e.enroll("fresh-1", "drv_bt_anything")
	if st, _, body := e.nodeCall(fresh.client, http.MethodPost, nodePath("fresh-1", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("fresh unknown host: %d %s", st, body)
	}
	created := e.auditDetails("host.create", "fresh-1", "unknown_host_registration")
	if len(created) != 1 || !strings.Contains(created[0], "source=127.0.0.1") {
		t.Fatalf("unknown-host registration audit %q, want one record with source=127.0.0.1", created)
	}
	if refused := e.auditDetails("host.register", "victim", "bootstrap_token_invalid"); len(refused) != 2 ||
		!strings.Contains(refused[0], "source=127.0.0.1") {
		t.Fatalf("refused re-registrations audit %q, want two with the source", refused)
	}
}

// TestWrongTokenIsNotEvidence: wrong bootstrap tokens for a healthy host
// leave its status alone; they are counted, audited with the source and
// rate limited per source address and per host id.
func TestWrongTokenIsNotEvidence(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) {
		c.RegisterRate, c.RegisterBurst = rate.Inf, 1000
		c.AuthFailRate, c.AuthFailBurst = rate.Every(time.Hour), 3
	})
	n := e.enroll("steady", e.createHost("steady").Token)
	if st, _, body := e.nodeCall(n.client, http.MethodPost, nodePath("steady", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", st, body)
	}
	e.waitHostStatus("steady", api.HostHealthy, 2*time.Second)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // keep it healthy, as its agent would
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				e.nodeCall(n.client, http.MethodPost, nodePath("steady", "/heartbeat"), api.Heartbeat{})
			}
		}
	}()
	e.createHost("other")

	for i := range 3 {
		if st, body, _ := e.register(regReq(t, "steady", "drv_bt_wrong")); st != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d %s", i, st, body)
		}
	}
	// A status change would be written at once; the host stays healthy.
	var h api.Host
	e.op(http.MethodGet, "/api/v1/hosts/steady", nil, &h)
	if h.Status != api.HostHealthy || !h.Schedulable {
		t.Fatalf("steady after wrong tokens: status %s (%s), schedulable %v", h.Status, h.StatusReason, h.Schedulable)
	}
	if e.auditHas("host.status", "steady", string(api.HostAuthFailed)) {
		t.Fatal("a wrong token changed the host status")
	}
	// The fourth from this source, for any host id, is refused unread.
	for _, id := range []string{"steady", "other"} {
		st, body, hdr := e.register(regReq(t, id, "drv_bt_wrong"))
		if st != http.StatusTooManyRequests || errCode(t, body) != "rate_limited" || hdr.Get("Retry-After") == "" {
			t.Fatalf("after 3 failures, %s from the same source: %d %s (Retry-After %q), want 429", id, st, body, hdr.Get("Retry-After"))
		}
	}
	// Another source is limited on the host id that failed, not on others.
	if st, body, _ := e.registerFrom("127.0.0.2", regReq(t, "steady", "drv_bt_wrong")); st != http.StatusTooManyRequests {
		t.Fatalf("steady from another source: %d %s, want 429 (per host id)", st, body)
	}
	if st, body, _ := e.registerFrom("127.0.0.2", regReq(t, "other", "drv_bt_wrong")); st != http.StatusUnauthorized {
		t.Fatalf("other from another source: %d %s, want 401", st, body)
	}

	refused := e.auditDetails("host.register", "steady", "bootstrap_token_invalid")
	if len(refused) != 3 {
		t.Fatalf("audit has %d refused attempts for steady, want 3: %q", len(refused), refused)
	}
	for _, d := range refused {
		if !strings.Contains(d, "source=127.0.0.1") {
			t.Errorf("refused attempt audited without its source: %q", d)
		}
	}
	if m := e.metrics(); !strings.Contains(m, `drover_registrations_total{result="bootstrap_token_invalid"} 4`) ||
		!strings.Contains(m, `drover_registrations_total{result="rate_limited"} 3`) {
		t.Fatalf("registration metrics:\n%s", grepLines(m, "drover_registrations_total"))
	}
}

func (e *env) metrics() string {
	e.t.Helper()
	resp, err := http.Get(e.opURL + "/metrics")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestRegisterRevealsNoHostState: every token failure of a known host gets
// one answer, whatever the host's state; an unknown id gets the seed's 404,
// behind the rate limit.
func TestRegisterRevealsNoHostState(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) {
		c.RegisterRate, c.RegisterBurst = rate.Inf, 1000
		c.AuthFailRate, c.AuthFailBurst = rate.Every(time.Hour), 100
	})
	e.createHost("fresh")
	e.enroll("enrolled", e.createHost("enrolled").Token)
	e.createHost("off")
	e.op(http.MethodPost, "/api/v1/hosts/off/disable", nil, nil)
	e.enroll("gone", e.createHost("gone").Token)
	e.op(http.MethodPost, "/api/v1/hosts/gone/revoke", nil, nil)
	e.createHost("late")
	expireToken(t, e, "late")

	type answer struct {
		status int
		body   string
		hdr    http.Header
	}
	ask := func(id, tok string) answer {
		st, body, hdr := e.register(regReq(t, id, tok))
		var eb api.ErrorBody
		_ = json.Unmarshal(body, &eb)
		cid := eb.Error.CorrelationID
		if cid == "" || hdr.Get(api.HeaderCorrelationID) != cid {
			t.Fatalf("%s: no correlation id in %s", id, body)
		}
		h := hdr.Clone()
		h.Del(api.HeaderCorrelationID)
		h.Del("Date")
		return answer{st, strings.ReplaceAll(string(body), cid, "CID"), h}
	}
	ref := ask("fresh", "drv_bt_wrong")
	if ref.status != http.StatusUnauthorized || strings.Contains(ref.body, "fresh") {
		t.Fatalf("known host, wrong token: %d %s (must not name the host)", ref.status, ref.body)
	}
	// enrolled and gone have no token outstanding; off's and late's are
	// outstanding (late's expired) but not the one presented.
	for _, c := range []struct{ id, tok string }{
		{"enrolled", "drv_bt_wrong"}, {"enrolled", "x"}, {"off", "drv_bt_wrong"},
		{"gone", "drv_bt_wrong"}, {"late", "drv_bt_wrong"},
	} {
		got := ask(c.id, c.tok)
		if got.status != ref.status || got.body != ref.body {
			t.Errorf("%s with %q: %d %s\nwant the same as a wrong token: %d %s", c.id, c.tok, got.status, got.body, ref.status, ref.body)
		}
		if d := diffHeaders(got.hdr, ref.hdr); d != "" {
			t.Errorf("%s with %q: headers differ: %s", c.id, c.tok, d)
		}
	}
	unknown := ask("nobody", "drv_bt_wrong")
	if unknown.status != http.StatusNotFound || !strings.Contains(unknown.body, `"unknown_host"`) {
		t.Fatalf("unknown host: %d %s, want the seed's 404 unknown_host", unknown.status, unknown.body)
	}
	// No token at all is a field error before any lookup: the same for
	// every id, known or not.
	none := ask("nobody", "")
	for _, id := range []string{"enrolled", "gone", "off"} {
		if got := ask(id, ""); got.status != http.StatusUnprocessableEntity || got.body != none.body {
			t.Errorf("%s without a token: %d %s, want %d %s", id, got.status, got.body, none.status, none.body)
		}
	}
}

func diffHeaders(a, b http.Header) string {
	for k := range a {
		if strings.Join(a.Values(k), ",") != strings.Join(b.Values(k), ",") {
			return k + ": " + strings.Join(a.Values(k), ",") + " vs " + strings.Join(b.Values(k), ",")
		}
	}
	if len(a) != len(b) {
		return "header count"
	}
	return ""
}

// TestUnknownHostProbesRateLimited: probing host ids is rate limited.
func TestUnknownHostProbesRateLimited(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) {
		c.RegisterRate, c.RegisterBurst = rate.Inf, 1000
		c.AuthFailRate, c.AuthFailBurst = rate.Every(time.Hour), 5
	})
	var last int
	for i := range 6 {
		last, _, _ = e.register(regReq(t, "probe-"+string(rune('a'+i)), "drv_bt_x"))
		if i < 5 && last != http.StatusNotFound {
			t.Fatalf("probe %d: %d, want 404", i, last)
		}
	}
	if last != http.StatusTooManyRequests {
		t.Fatalf("sixth probe: %d, want 429", last)
	}
	if d := e.auditDetails("host.register", "probe-a", "unknown_host"); len(d) != 1 || !strings.Contains(d[0], "source=127.0.0.1") {
		t.Fatalf("probe audit %q", d)
	}
}

// TestSupersededCertificateMarksAuthFailed: a certificate the CA issued to
// the host, refused because a later enrolment superseded it, is evidence:
// the host shows auth_failed until its current identity heartbeats again.
func TestSupersededCertificateMarksAuthFailed(t *testing.T) {
	e := startEnv(t, openSQLite(t))
	old := e.enroll("node-x", e.createHost("node-x").Token)
	var bt api.BootstrapToken
	e.op(http.MethodPost, "/api/v1/hosts/node-x/rotate-token", nil, &bt)
	time.Sleep(1100 * time.Millisecond) // certificates carry second precision
	cur := e.enroll("node-x", bt.Token)
	if st, code, _ := e.nodeCall(old.client, http.MethodPost, nodePath("node-x", "/heartbeat"), api.Heartbeat{}); st != http.StatusForbidden || code != "node_identity_superseded" {
		t.Fatalf("old identity: %d %s", st, code)
	}
	h := e.waitHostStatus("node-x", api.HostAuthFailed, 2*time.Second)
	if h.StatusReason != "node_identity_superseded" {
		t.Fatalf("status reason %q", h.StatusReason)
	}
	if st, _, body := e.nodeCall(cur.client, http.MethodPost, nodePath("node-x", "/heartbeat"), api.Heartbeat{}); st != http.StatusOK {
		t.Fatalf("current identity: %d %s", st, body)
	}
	e.waitHostStatus("node-x", api.HostHealthy, 2*time.Second)
}
