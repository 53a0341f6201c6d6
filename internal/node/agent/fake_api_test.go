package agent_test

// A fake control plane for agent-level tests: a real TLS listener whose
// server certificate comes from a real pki.CA, speaking the node API routes
// the agent uses. Tests drive it (queue deliveries, make routes fail) and
// assert on what it recorded, never on agent internals.

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
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

	mu        sync.Mutex
	enrolJWKS api.JWKS // returned by register
	jwks      api.JWKS // returned by GET .../jwks
	queue     []api.TaskDelivery
	waitMax   []int // the ?max= of each wait, in order (0: none)
	// resultBatches is the size of each POST .../tasks/results accepted.
	// refuseBatches, when set, is that route's answer to every batch: 404
	// as from a control plane without it, any other status as a refusal of
	// the whole batch. holdResult, when set, holds every result post until
	// it is closed.
	resultBatches []int
	batchAttempts int // POST .../tasks/results received, refused or not
	refuseBatches int
	holdResult    chan struct{}
	registers     int
	// credentials is each registration's credential, in order: "token",
	// or "previous_certificate" (which the fake refuses as superseded).
	credentials []string
	jwksGets    int
	caps        []api.Capabilities
	heartbeats  []heartbeatPost
	events      map[string][]api.TaskEvent
	results     map[string][]resultPost
	failResults int  // answer this many result posts with 503
	failAll     bool // answer every result post with 503
	// noResultFields answers a result whose error carries fields with 422
	// invalid_json, as a control plane that predates
	// api.ResultError.Fields (and decodes strictly) does.
	noResultFields bool
	// heartbeatStatus, when set, picks the answer to heartbeat n (1-based):
	// 0 or 200 for success, anything else is sent with Retry-After: 1.
	heartbeatStatus func(n int) int
	// enrolTTL is the lifetime of the certificate register issues (0: an
	// hour); renewals always get an hour. renewStarted, when set, gets a
	// value (without blocking) when a renewal request arrives, and
	// renewGate, when set, holds the answer until it is closed. The
	// answer's JWKS is jwks as it was when the request arrived.
	enrolTTL     time.Duration
	renewStarted chan struct{}
	renewGate    chan struct{}
	renewedUntil time.Time // NotAfter of the last renewed certificate
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
	// The routes come from the node API table: a route the table drops or
	// renames breaks this file at compile time.
	mux := http.NewServeMux()
	mux.HandleFunc(nodeapi.Register.MuxPattern(), f.register)
	mux.HandleFunc(nodeapi.WaitTask.MuxPattern(), f.nodeAuth(f.wait))
	mux.HandleFunc(nodeapi.JWKS.MuxPattern(), f.nodeAuth(f.getJWKS))
	mux.HandleFunc(nodeapi.Heartbeat.MuxPattern(), f.nodeAuth(f.heartbeat))
	mux.HandleFunc(nodeapi.PutCapabilities.MuxPattern(), f.nodeAuth(f.capabilities))
	mux.HandleFunc(nodeapi.PostEvent.MuxPattern(), f.nodeAuth(f.event))
	mux.HandleFunc(nodeapi.PostResult.MuxPattern(), f.nodeAuth(f.result))
	mux.HandleFunc(nodeapi.PostResults.MuxPattern(), f.nodeAuth(f.resultBatch))
	mux.HandleFunc(nodeapi.Renew.MuxPattern(), f.nodeAuth(f.renew))
	mux.HandleFunc(nodeapi.DesiredInstances.MuxPattern(), f.nodeAuth(f.instances))
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
	if req.PreviousCertificate != nil {
		f.mu.Lock()
		f.credentials = append(f.credentials, "previous_certificate")
		f.mu.Unlock()
		writeError(w, http.StatusUnauthorized, "previous_certificate_superseded", "not the host's last certificate")
		return
	}
	f.mu.Lock()
	f.credentials = append(f.credentials, "token")
	f.mu.Unlock()
	if req.BootstrapToken != testToken {
		writeError(w, http.StatusUnauthorized, "bootstrap_token_invalid", "wrong token")
		return
	}
	f.mu.Lock()
	ttl := f.enrolTTL
	f.mu.Unlock()
	if ttl == 0 {
		ttl = time.Hour
	}
	certPEM, _, notAfter, err := f.ca.SignNodeCSR([]byte(req.CSRPEM), req.HostID, ttl, time.Now())
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
	limit, _ := strconv.Atoi(r.URL.Query().Get("max"))
	f.mu.Lock()
	f.waitMax = append(f.waitMax, limit)
	f.mu.Unlock()
	for {
		f.mu.Lock()
		if len(f.queue) > 0 {
			n := min(len(f.queue), max(limit, 1))
			d := f.queue[0]
			d.More = slices.Clone(f.queue[1:n])
			f.queue = f.queue[n:]
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

// renew issues an hour's certificate with the JWKS of the request's time.
func (f *fakeCP) renew(w http.ResponseWriter, r *http.Request) {
	var req api.RenewRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "invalid_json", err.Error())
		return
	}
	f.mu.Lock()
	jwks, started, gate := f.jwks, f.renewStarted, f.renewGate
	f.mu.Unlock()
	if started != nil {
		select {
		case started <- struct{}{}:
		default:
		}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	id := r.PathValue("id")
	certPEM, _, notAfter, err := f.ca.SignNodeCSR([]byte(req.CSRPEM), id, time.Hour, time.Now())
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, "invalid_csr", err.Error())
		return
	}
	f.mu.Lock()
	f.renewedUntil = notAfter
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, api.Identity{NodeID: id, CertificatePEM: string(certPEM),
		CABundlePEM: string(f.ca.CertPEM()), NotAfter: notAfter, JWKS: jwks,
		HeartbeatInterval: api.Duration(100 * time.Millisecond)})
}

// renewed is the NotAfter of the last renewed certificate (zero: none).
func (f *fakeCP) renewed() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renewedUntil
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
	switch status {
	case http.StatusOK:
	case http.StatusForbidden: // what the control plane answers a revoked node
		writeError(w, status, "node_identity_revoked", "node identity revoked")
		return
	case http.StatusNotFound: // a control plane (or edge) without the route
		http.NotFound(w, r)
		return
	default:
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
	f.hold(r)
	id := r.PathValue("task_id")
	status, ack := f.record(id, body)
	if status != http.StatusOK {
		writeJSON(w, status, api.ErrorBody{Error: *ack.Error})
		return
	}
	writeJSON(w, http.StatusOK, nodeapi.ResultAck{TaskID: id, State: ack.State})
}

// resultBatch records each result of POST .../tasks/results as result
// records a single one.
func (f *fakeCP) resultBatch(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	refuse := f.refuseBatches
	f.batchAttempts++
	f.mu.Unlock()
	switch refuse {
	case 0:
	case http.StatusNotFound:
		http.NotFound(w, r)
		return
	default:
		writeError(w, refuse, "request_too_large", "request body too large")
		return
	}
	var req struct {
		Results []struct {
			TaskID string          `json:"task_id"`
			Result json.RawMessage `json:"result"`
		} `json:"results"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Results) < 2 {
		f.t.Errorf("fake control plane: results batch %v with %d results", err, len(req.Results))
		writeError(w, http.StatusUnprocessableEntity, "invalid_json", fmt.Sprint(err))
		return
	}
	f.hold(r)
	f.mu.Lock()
	f.resultBatches = append(f.resultBatches, len(req.Results))
	f.mu.Unlock()
	var out nodeapi.ResultsAck
	for _, item := range req.Results {
		_, ack := f.record(item.TaskID, item.Result)
		out.Results = append(out.Results, ack)
	}
	writeJSON(w, http.StatusOK, out)
}

// hold waits for holdResult to close, when it is set.
func (f *fakeCP) hold(r *http.Request) {
	f.mu.Lock()
	gate := f.holdResult
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}
}

// record decodes one result strictly, records it and says what the single
// route answers (failResults, failAll and noResultFields apply).
func (f *fakeCP) record(id string, body []byte) (int, nodeapi.ResultItemAck) {
	refuse := func(status int, code, msg string) (int, nodeapi.ResultItemAck) {
		return status, nodeapi.ResultItemAck{TaskID: id, Status: status, Error: &api.ErrorDetail{Code: code, Message: msg}}
	}
	var res api.TaskResult
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil {
		f.t.Errorf("fake control plane: result body does not decode strictly: %v: %s", err, body)
		return refuse(http.StatusUnprocessableEntity, "invalid_json", err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noResultFields && res.Error != nil && len(res.Error.Fields) > 0 {
		f.results[id] = append(f.results[id], resultPost{Body: body, Result: res, Status: http.StatusUnprocessableEntity, At: time.Now()})
		return refuse(http.StatusUnprocessableEntity, "invalid_json", `request body: json: unknown field "fields"`)
	}
	status := http.StatusOK
	if f.failAll || f.failResults > 0 {
		status = http.StatusServiceUnavailable
		if f.failResults > 0 {
			f.failResults--
		}
	}
	f.results[id] = append(f.results[id], resultPost{Body: slices.Clone(body), Result: res, Status: status, At: time.Now()})
	if status != http.StatusOK {
		return refuse(status, "unavailable", "try again later")
	}
	return status, nodeapi.ResultItemAck{TaskID: id, Status: http.StatusOK, State: api.TaskState(res.Status)}
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

// enqueue makes ds the next deliveries of GET .../tasks/wait, queued
// together: a wait that asks for several may get them in one answer.
func (f *fakeCP) enqueue(ds ...api.TaskDelivery) {
	f.mu.Lock()
	f.queue = append(f.queue, ds...)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// batches is the size of each POST .../tasks/results so far.
func (f *fakeCP) batches() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.resultBatches)
}

// waitMaxes is the ?max= of each wait so far (0: none).
func (f *fakeCP) waitMaxes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.waitMax)
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

func (f *fakeCP) setNoResultFields(on bool) {
	f.mu.Lock()
	f.noResultFields = on
	f.mu.Unlock()
}

func (f *fakeCP) setHeartbeatStatus(fn func(n int) int) {
	f.mu.Lock()
	f.heartbeatStatus = fn
	f.mu.Unlock()
}

// credentialLog is each registration's credential, in order.
func (f *fakeCP) credentialLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.credentials)
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
