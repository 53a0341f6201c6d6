package agent_test

// A fake control plane for agent-level tests: a real TLS listener whose
// server certificate comes from a real pki.CA, speaking the node API routes
// the agent uses. Tests drive it (queue deliveries, make routes fail) and
// assert on what it recorded, never on agent internals.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/task"
)

const (
	testToken    = "bootstrap-token-for-tests"
	testNodeID   = "node-under-test"
	testTaskType = "test.count"
	// fakeWait is how long GET .../tasks/wait holds an empty queue before 204.
	fakeWait = 50 * time.Millisecond
	// waitDeadline bounds every poll for something the fake should record.
	waitDeadline = 10 * time.Second
)

// resultPost is one POST .../tasks/{task_id}/result as the fake saw it.
type resultPost struct {
	Body   []byte // exactly what the agent sent
	Result api.TaskResult
	Status int // what the fake answered
	At     time.Time
}

// heartbeatPost is one POST .../heartbeat.
type heartbeatPost struct {
	HB     api.Heartbeat
	Status int
	At     time.Time
}

// fakeCP is the fake control plane.
type fakeCP struct {
	t      *testing.T
	ca     *pki.CA
	signer *task.Signer
	srv    *httptest.Server
	wake   chan struct{}

	mu          sync.Mutex
	enrolJWKS   api.JWKS // returned by register
	jwks        api.JWKS // returned by GET .../jwks
	queue       []api.TaskDelivery
	registers   int
	jwksGets    int
	caps        []api.Capabilities
	heartbeats  []heartbeatPost
	events      map[string][]api.TaskEvent
	results     map[string][]resultPost
	failResults int  // answer this many result posts with 503
	failAll     bool // answer every result post with 503
	// heartbeatStatus, when set, picks the answer to heartbeat n (1-based):
	// 0 or 200 for success, anything else is sent with Retry-After: 1.
	heartbeatStatus func(n int) int
}

func newFakeCP(t *testing.T) *fakeCP {
	t.Helper()
	now := time.Now()
	certPEM, keyPEM, err := pki.NewCA("drover test CA", now)
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	ca, err := pki.LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("LoadCA: %v", err)
	}
	f := &fakeCP{t: t, ca: ca, signer: newSigner(t), wake: make(chan struct{}, 1),
		events: map[string][]api.TaskEvent{}, results: map[string][]resultPost{}}
	f.enrolJWKS = api.JWKS{Keys: []api.JWK{f.signer.PublicJWK()}}
	f.jwks = f.enrolJWKS

	serverCert, err := ca.ServerCertificate([]string{"127.0.0.1"}, time.Hour, now)
	if err != nil {
		t.Fatalf("ServerCertificate: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/v1/register", f.register)
	mux.HandleFunc("GET /internal/v1/nodes/{id}/tasks/wait", f.nodeAuth(f.wait))
	mux.HandleFunc("GET /internal/v1/nodes/{id}/jwks", f.nodeAuth(f.getJWKS))
	mux.HandleFunc("POST /internal/v1/nodes/{id}/heartbeat", f.nodeAuth(f.heartbeat))
	mux.HandleFunc("PUT /internal/v1/nodes/{id}/capabilities", f.nodeAuth(f.capabilities))
	mux.HandleFunc("POST /internal/v1/nodes/{id}/tasks/{task_id}/events", f.nodeAuth(f.event))
	mux.HandleFunc("POST /internal/v1/nodes/{id}/tasks/{task_id}/result", f.nodeAuth(f.result))
	mux.HandleFunc("GET /internal/v1/nodes/{id}/instances", f.nodeAuth(f.instances))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("fake control plane: unexpected request %s %s", r.Method, r.URL.Path)
		writeError(w, http.StatusNotFound, "not_found", "no such route")
	})
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.TLS = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.Pool(),
	}
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshake noise from the pinned-CA probe
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func newSigner(t *testing.T) *task.Signer {
	t.Helper()
	kid, key, err := task.GenerateKey()
	if err != nil {
		t.Fatalf("GenerateKey: %v", err)
	}
	return task.NewSigner(kid, key)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: msg}})
}

// nodeAuth is what the real node API does: every /nodes/{id} route needs a
// client certificate (already verified against the CA by TLS) naming {id}.
func (f *fakeCP) nodeAuth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(w, http.StatusUnauthorized, "client_certificate_required", "no client certificate")
			return
		}
		id, err := pki.NodeID(r.TLS.PeerCertificates[0])
		if err != nil {
			writeError(w, http.StatusUnauthorized, "client_certificate_invalid", err.Error())
			return
		}
		if id != r.PathValue("id") {
			writeError(w, http.StatusForbidden, "node_mismatch", fmt.Sprintf("certificate is for %q", id))
			return
		}
		next(w, r)
	}
}

func (f *fakeCP) register(w http.ResponseWriter, r *http.Request) {
	req, fields, err := api.DecodeRegister(r.Body)
	if err != nil || len(fields) > 0 {
		writeError(w, http.StatusUnprocessableEntity, "invalid", fmt.Sprintf("%v %v", err, fields))
		return
	}
	if req.BootstrapToken != testToken {
		writeError(w, http.StatusUnauthorized, "bootstrap_token_invalid", "wrong token")
		return
	}
	certPEM, _, notAfter, err := f.ca.SignNodeCSR([]byte(req.CSRPEM), req.HostID, time.Hour, time.Now())
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, "invalid_csr", err.Error())
		return
	}
	f.mu.Lock()
	f.registers++
	jwks := f.enrolJWKS
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, api.Identity{NodeID: req.HostID, CertificatePEM: string(certPEM),
		CABundlePEM: string(f.ca.CertPEM()), NotAfter: notAfter, JWKS: jwks,
		HeartbeatInterval: api.Duration(100 * time.Millisecond)})
}

func (f *fakeCP) wait(w http.ResponseWriter, r *http.Request) {
	timer := time.NewTimer(fakeWait)
	defer timer.Stop()
	for {
		f.mu.Lock()
		if len(f.queue) > 0 {
			d := f.queue[0]
			f.queue = f.queue[1:]
			f.mu.Unlock()
			writeJSON(w, http.StatusOK, d)
			return
		}
		f.mu.Unlock()
		select {
		case <-f.wake:
		case <-timer.C:
			w.WriteHeader(http.StatusNoContent)
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (f *fakeCP) getJWKS(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	f.jwksGets++
	jwks := f.jwks
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, jwks)
}

// capabilities records the last capabilities report.
func (f *fakeCP) capabilities(w http.ResponseWriter, r *http.Request) {
	var c api.Capabilities
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "invalid_json", err.Error())
		return
	}
	f.mu.Lock()
	f.caps = append(f.caps, c)
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeCP) heartbeat(w http.ResponseWriter, r *http.Request) {
	var hb api.Heartbeat
	if err := json.NewDecoder(r.Body).Decode(&hb); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "invalid_json", err.Error())
		return
	}
	f.mu.Lock()
	status := http.StatusOK
	if f.heartbeatStatus != nil {
		if s := f.heartbeatStatus(len(f.heartbeats) + 1); s != 0 {
			status = s
		}
	}
	f.heartbeats = append(f.heartbeats, heartbeatPost{HB: hb, Status: status, At: time.Now()})
	f.mu.Unlock()
	if status != http.StatusOK {
		w.Header().Set("Retry-After", "1")
		writeError(w, status, "rate_limited", "slow down")
		return
	}
	writeJSON(w, http.StatusOK, api.HeartbeatResponse{HeartbeatInterval: api.Duration(100 * time.Millisecond)})
}

func (f *fakeCP) event(w http.ResponseWriter, r *http.Request) {
	var ev api.TaskEvent
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "invalid_json", err.Error())
		return
	}
	f.mu.Lock()
	f.events[r.PathValue("task_id")] = append(f.events[r.PathValue("task_id")], ev)
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeCP) result(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "read", err.Error())
		return
	}
	var res api.TaskResult
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		f.t.Errorf("fake control plane: result body does not decode strictly: %v: %s", err, body)
		writeError(w, http.StatusUnprocessableEntity, "invalid_json", err.Error())
		return
	}
	id := r.PathValue("task_id")
	f.mu.Lock()
	status := http.StatusOK
	if f.failAll || f.failResults > 0 {
		status = http.StatusServiceUnavailable
		if f.failResults > 0 {
			f.failResults--
		}
	}
	f.results[id] = append(f.results[id], resultPost{Body: body, Result: res, Status: status, At: time.Now()})
	f.mu.Unlock()
	if status != http.StatusOK {
		writeError(w, status, "unavailable", "try again later")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"task_id": id, "state": string(res.Status)})
}

// instances answers the desired-set long-poll of an agent that runs
// instances: always the empty set, after a short wait so the agent does not
// spin.
func (f *fakeCP) instances(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("etag") != "" {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	writeJSON(w, http.StatusOK, api.NodeInstances{ETag: "empty", Instances: []api.DesiredInstance{}})
}

// enqueue makes d the next delivery of GET .../tasks/wait.
func (f *fakeCP) enqueue(d api.TaskDelivery) {
	f.mu.Lock()
	f.queue = append(f.queue, d)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *fakeCP) setJWKS(jwks api.JWKS) {
	f.mu.Lock()
	f.jwks = jwks
	f.mu.Unlock()
}

func (f *fakeCP) setFailResults(n int, all bool) {
	f.mu.Lock()
	f.failResults, f.failAll = n, all
	f.mu.Unlock()
}

func (f *fakeCP) setHeartbeatStatus(fn func(n int) int) {
	f.mu.Lock()
	f.heartbeatStatus = fn
	f.mu.Unlock()
}

func (f *fakeCP) registerCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.registers
}

func (f *fakeCP) jwksCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.jwksGets
}

func (f *fakeCP) resultsFor(taskID string) []resultPost {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.results[taskID])
}

func (f *fakeCP) allResults() map[string][]resultPost {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string][]resultPost, len(f.results))
	for k, v := range f.results {
		out[k] = slices.Clone(v)
	}
	return out
}

func (f *fakeCP) eventsFor(taskID string) []api.TaskEvent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events[taskID])
}

func (f *fakeCP) heartbeatLog() []heartbeatPost {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.heartbeats)
}

// accepted returns the result posts of taskID that the fake answered 200.
func (f *fakeCP) accepted(taskID string) []resultPost {
	var out []resultPost
	for _, p := range f.resultsFor(taskID) {
		if p.Status == http.StatusOK {
			out = append(out, p)
		}
	}
	return out
}

// waitAccepted polls until n results of taskID were accepted and returns them.
func (f *fakeCP) waitAccepted(t *testing.T, taskID string, n int) []resultPost {
	t.Helper()
	var got []resultPost
	eventually(t, fmt.Sprintf("%d accepted result(s) for task %s", n, taskID), func() bool {
		got = f.accepted(taskID)
		return len(got) >= n
	})
	return got
}

// fixedAccel is an accelerator probe that reports only the named ones as
// working (the real probe boots a KVM guest; internal/node/accel tests it).
func fixedAccel(working ...string) func(context.Context) (accel.Result, error) {
	return func(context.Context) (accel.Result, error) {
		var r accel.Result
		for _, n := range accel.Names() {
			st := accel.Status{Name: n, Reason: "test_fixture"}
			if slices.Contains(working, n) {
				st.Works, st.Reason = true, accel.ReasonOK
				r.Working = append(r.Working, n)
			}
			r.Accelerators = append(r.Accelerators, st)
		}
		return r, nil
	}
}

// eventually polls cond every few milliseconds until it holds or the
// deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitDeadline, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---- envelopes ----

// claims returns valid claims for a task of typ addressed to testNodeID.
func claims(taskID, typ string) api.TaskClaims {
	now := time.Now()
	return api.TaskClaims{TaskID: taskID, NodeID: testNodeID, Type: typ, Params: json.RawMessage(`{"n":1}`),
		CorrelationID: "cid-" + taskID, IssuedAt: now.Unix(), ExpiresAt: now.Add(10 * time.Minute).Unix()}
}

func sign(t *testing.T, s *task.Signer, c api.TaskClaims) string {
	t.Helper()
	env, err := s.Sign(c)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return env
}

// deliveryFor is the delivery a correct control plane sends for c.
func deliveryFor(c api.TaskClaims, envelope string) api.TaskDelivery {
	return api.TaskDelivery{TaskID: c.TaskID, TaskType: c.Type, Envelope: envelope,
		ExpiresAt: time.Unix(c.ExpiresAt, 0).UTC(), CorrelationID: c.CorrelationID, Attempt: 1}
}

var b64 = base64.RawURLEncoding

// editPayload decodes the payload segment of a compact JWS, applies edit to
// the JSON bytes and re-encodes it, keeping the original header and
// signature. The result is still canonical base64url.
func editPayload(t *testing.T, compact string, edit func([]byte) []byte) string {
	t.Helper()
	segs := strings.Split(compact, ".")
	if len(segs) != 3 {
		t.Fatalf("not a compact JWS: %q", compact)
	}
	payload, err := b64.DecodeString(segs[1])
	if err != nil {
		t.Fatalf("decode payload: %v", err)
	}
	edited := edit(bytes.Clone(payload))
	if bytes.Equal(edited, payload) {
		t.Fatalf("edit did not change the payload %s", payload)
	}
	return segs[0] + "." + b64.EncodeToString(edited) + "." + segs[2]
}

// flipPayloadChar swaps one base64url character in the middle of the
// payload segment for another; a non-final character carries no padding
// bits, so the segment stays canonical base64url but decodes differently.
func flipPayloadChar(t *testing.T, compact string) string {
	t.Helper()
	segs := strings.Split(compact, ".")
	p := []byte(segs[1])
	i := len(p) / 2
	if p[i] == 'A' {
		p[i] = 'B'
	} else {
		p[i] = 'A'
	}
	return segs[0] + "." + string(p) + "." + segs[2]
}

// hs256 re-signs the payload of compact with HS256, using the Ed25519 public
// key bytes of jwk as the HMAC secret (the classic algorithm-confusion
// attack).
func hs256(t *testing.T, compact string, jwk api.JWK) string {
	t.Helper()
	segs := strings.Split(compact, ".")
	pub, err := b64.DecodeString(jwk.X)
	if err != nil {
		t.Fatalf("decode jwk x: %v", err)
	}
	hdr := b64.EncodeToString([]byte(fmt.Sprintf(`{"alg":"HS256","kid":%q,"typ":%q}`, jwk.Kid, task.EnvelopeType)))
	mac := hmac.New(sha256.New, pub)
	mac.Write([]byte(hdr + "." + segs[1]))
	return hdr + "." + segs[1] + "." + b64.EncodeToString(mac.Sum(nil))
}

// ---- agents ----

// counter is a task handler that counts its runs.
type counter struct {
	runs atomic.Int64
	mu   sync.Mutex
	ids  []string
}

func (c *counter) handlers() agent.Handlers {
	return agent.Handlers{testTaskType: {Timeout: 5 * time.Second, Run: func(_ context.Context, tk agent.Task) (agent.Outcome, error) {
		c.runs.Add(1)
		c.mu.Lock()
		c.ids = append(c.ids, tk.ID)
		c.mu.Unlock()
		tk.Progress("work", 3*time.Millisecond, nil)
		return agent.Outcome{Output: map[string]any{"task_id": tk.ID, "params": tk.Params},
			Timings: map[string]int64{"work_ms": 3}}, nil
	}}}
}

// syncBuffer collects agent logs; they are printed when a test fails.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runningAgent is an agent.Run in a goroutine.
type runningAgent struct {
	*agent.Agent
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // what Run returned, once done is closed
	once   sync.Once
}

func (r *runningAgent) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// stop cancels the agent and waits for Run to return.
func (r *runningAgent) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
			if r.err != nil {
				t.Errorf("agent Run returned %v", r.err)
			}
		case <-time.After(waitDeadline):
			t.Errorf("agent did not stop within %s", waitDeadline)
		}
	})
}

// startAgent runs a real agent against f with state in stateDir and waits
// until it has heartbeated once (so it is enrolled and all loops run).
func startAgent(t *testing.T, f *fakeCP, stateDir string, h agent.Handlers, opts ...agent.Option) *runningAgent {
	t.Helper()
	return startAgentConfig(t, f, testConfig(f, stateDir), h, opts...)
}

// testConfig is the configuration startAgent runs with: no instances.
func testConfig(f *fakeCP, stateDir string) agent.Config {
	return agent.Config{ControlPlaneURL: f.srv.URL, HostID: testNodeID, BootstrapToken: testToken,
		CAHash: f.ca.Hash(), OSFamily: api.OSLinux, StateDir: stateDir, ListenAddr: "127.0.0.1:0",
		HeartbeatInterval: 100 * time.Millisecond}
}

// startAgentConfig is startAgent with a configuration of the test's own.
func startAgentConfig(t *testing.T, f *fakeCP, cfg agent.Config, h agent.Handlers, opts ...agent.Option) *runningAgent {
	t.Helper()
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	})
	a, err := agent.New(cfg, append([]agent.Option{agent.WithHandlers(h), agent.WithAccelProbe(fixedAccel(accel.TCG)),
		agent.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))}, opts...)...)
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	if a.NodeID() != testNodeID {
		t.Fatalf("NodeID() = %q, want %q", a.NodeID(), testNodeID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{Agent: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = a.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { r.stop(t) })
	before := len(f.heartbeatLog())
	eventually(t, "the agent's first heartbeat", func() bool {
		if r.exited() {
			t.Fatalf("agent Run returned early: %v", r.err)
		}
		return len(f.heartbeatLog()) > before
	})
	return r
}
