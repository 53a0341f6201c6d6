package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// logBuf is a concurrency-safe buffer a test's slog handler writes to.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }

func (l *logBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func (l *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// secretForms are the ways a value could leak: as is, and as base64.
func secretForms(v string) []string {
	return []string{v, base64.StdEncoding.EncodeToString([]byte(v)), base64.RawStdEncoding.EncodeToString([]byte(v))}
}

// assertNoValue fails when any form of value appears in text.
func assertNoValue(t *testing.T, where, text, value string) {
	t.Helper()
	for _, f := range secretForms(value) {
		if strings.Contains(text, f) {
			t.Errorf("%s holds the secret value (%q)", where, f)
		}
	}
}

// rawOp calls the operator API with a raw body and returns status and body.
func (e *env) rawOp(method, path, body string) (int, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.opURL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.opToken)
	resp, err := e.opHTTP.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// TestSecretsAPI: set (text and base64), replace, list, show and delete a
// workload secret; validation; without a KEK the control plane refuses to
// store one. No answer, audit record, log line or database row holds the
// value.
func TestSecretsAPI(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			var logs logBuf
			st := b.open(t)
			e := startEnv(t, st, func(c *server.Config) { c.Logger = logs.logger() })
			value := "s3cr3t-value-" + fmt.Sprint(time.Now().UnixNano())
			var outputs []string
			call := func(method, path, body string, want int) []byte {
				t.Helper()
				code, raw := e.rawOp(method, path, body)
				outputs = append(outputs, string(raw))
				if code != want {
					t.Fatalf("%s %s: %d %s, want %d", method, path, code, raw, want)
				}
				return raw
			}
			jv, _ := json.Marshal(value)
			call(http.MethodPut, "/api/v1/secrets/db-password", `{"value":`+string(jv)+`}`, http.StatusCreated)
			var s api.Secret
			raw := call(http.MethodPut, "/api/v1/secrets/db-password",
				`{"value_base64":"`+base64.StdEncoding.EncodeToString([]byte(value+"-2"))+`"}`, http.StatusOK)
			if err := json.Unmarshal(raw, &s); err != nil || s.Version != 2 || s.Name != "db-password" ||
				s.CreatedBy != "operator:test" || s.UpdatedAt.IsZero() {
				t.Fatalf("replaced = %s (%v), want version 2", raw, err)
			}
			var list []api.Secret
			if err := json.Unmarshal(call(http.MethodGet, "/api/v1/secrets", "", http.StatusOK), &list); err != nil ||
				len(list) != 1 || list[0].Version != 2 {
				t.Fatalf("list = %+v (%v)", list, err)
			}
			call(http.MethodGet, "/api/v1/secrets/db-password", "", http.StatusOK)

			// Validation: never an echo of the body.
			for _, tc := range []struct{ path, body, code string }{
				{"/api/v1/secrets/Bad_Name", `{"value":"x"}`, "invalid_payload"},
				{"/api/v1/secrets/ok", `{"value":"x","value_base64":"eA=="}`, "invalid_payload"},
				{"/api/v1/secrets/ok", `{}`, "invalid_payload"},
				{"/api/v1/secrets/ok", `{"value":""}`, "invalid_payload"},
				{"/api/v1/secrets/ok", `{"value_base64":"not base64 ` + value + `"}`, "invalid_payload"},
				{"/api/v1/secrets/ok", `{"value":` + string(jv) + `,"other":1}`, "invalid_json"},
				{"/api/v1/secrets/ok", `{"value":` + string(jv), "invalid_json"},
				{"/api/v1/secrets/ok", `{"value":"` + strings.Repeat("a", api.MaxSecretValue+1) + `"}`, "invalid_payload"},
			} {
				raw := call(http.MethodPut, tc.path, tc.body, http.StatusUnprocessableEntity)
				var eb api.ErrorBody
				if json.Unmarshal(raw, &eb) != nil || eb.Error.Code != tc.code {
					t.Errorf("PUT %s %.40q: %s, want %s", tc.path, tc.body, raw, tc.code)
				}
			}
			call(http.MethodGet, "/api/v1/secrets/ok", "", http.StatusNotFound)

			// The row is sealed: neither form of either value is in it.
			ws, err := st.GetWorkloadSecret(t.Context(), "db-password")
			if err != nil {
				t.Fatal(err)
			}
			assertNoValue(t, "the stored row", string(ws.Value), value)
			if !bytes.HasPrefix(ws.Value, []byte("drover-kek:v1:")) {
				t.Errorf("stored value is not sealed with the KEK: %.20q", ws.Value)
			}

			call(http.MethodDelete, "/api/v1/secrets/db-password", "", http.StatusNoContent)
			call(http.MethodDelete, "/api/v1/secrets/db-password", "", http.StatusNotFound)
			call(http.MethodGet, "/api/v1/secrets/db-password", "", http.StatusNotFound)
			if !e.auditHas("secret.set", "db-password", "created") || !e.auditHas("secret.set", "db-password", "updated") ||
				!e.auditHas("secret.delete", "db-password", "deleted") {
				t.Error("secret.set/created, secret.set/updated and secret.delete/deleted not all audited")
			}
			audit := call(http.MethodGet, "/api/v1/audit?limit=1000", "", http.StatusOK)
			for where, text := range map[string]string{"an API answer": strings.Join(outputs, "\n"),
				"the audit log": string(audit), "the control plane's log": logs.String()} {
				assertNoValue(t, where, text, value)
			}
			if !strings.Contains(logs.String(), "secret set") {
				t.Error("the log has no 'secret set' line: is the capture working?")
			}
		})
	}
}

// TestSecretsNeedKEK: under --insecure-plaintext-keys no secret is stored.
func TestSecretsNeedKEK(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.KEK, c.InsecurePlaintextKeys = nil, true })
	code, raw := e.rawOp(http.MethodPut, "/api/v1/secrets/db-password", `{"value":"x"}`)
	if code != http.StatusConflict || !strings.Contains(string(raw), "secrets_need_kek") {
		t.Fatalf("set without a KEK: %d %s, want 409 secrets_need_kek", code, raw)
	}
}

// putInstance stores an instance record on host with the given secret
// names (no placement: the node route only reads the record).
func putInstance(t *testing.T, st store.Store, id, host string, secrets ...string) {
	t.Helper()
	spec, _ := json.Marshal(api.InstanceSpec{Image: fakeImage, VCPUs: 1, MemoryMiB: 128, Secrets: secrets})
	now := time.Now().UTC().Truncate(time.Millisecond)
	if err := st.CreateInstance(t.Context(), store.Instance{ID: id, Name: id, HostID: host, Spec: spec,
		DesiredState: api.DesiredRunning, Generation: 1, Phase: api.InstancePending, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
}

// TestSecretsNodeRoute: a node gets the values of the secrets an instance
// placed on it names, and nothing else: another node's instance, an
// instance naming none and a name the spec does not list are 404 and
// audited as denied; another node's path is 403; a revoked node is 403.
func TestSecretsNodeRoute(t *testing.T) {
	st := openSQLite(t)
	e := startEnv(t, st)
	n1 := e.enroll("sec-n1", e.createHost("sec-n1").Token)
	n2 := e.enroll("sec-n2", e.createHost("sec-n2").Token)
	putInstance(t, st, "in-1", "sec-n1", "db-password", "absent", "Local_Only")
	putInstance(t, st, "in-none", "sec-n1")
	if code, raw := e.rawOp(http.MethodPut, "/api/v1/secrets/db-password", `{"value":"pw-1"}`); code != http.StatusCreated {
		t.Fatalf("set: %d %s", code, raw)
	}
	if code, raw := e.rawOp(http.MethodPut, "/api/v1/secrets/unlisted", `{"value":"nope"}`); code != http.StatusCreated {
		t.Fatalf("set: %d %s", code, raw)
	}

	resp, raw := e.fetchSecrets(n1, "in-1")
	var got api.InstanceSecrets
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &got) != nil {
		t.Fatalf("own instance: %d %s", resp.StatusCode, raw)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	if len(got.Secrets) != 1 || got.Secrets[0].Name != "db-password" || string(got.Secrets[0].Value) != "pw-1" ||
		got.Secrets[0].Version != 1 || !slices.Equal(got.Missing, []string{"absent", "Local_Only"}) {
		t.Errorf("answer = %+v, want db-password=pw-1, missing absent and Local_Only", got)
	}
	if !e.auditHas("secret.fetch", "in-1", "ok") {
		t.Error("the delivery is not audited")
	}

	for _, tc := range []struct {
		name   string
		caller nodeIdentity
		path   string
		status int
		code   string
		denied string // audit target of a denied record
	}{
		{"another node's instance", n2, nodePath(n2.id, "/instances/in-1/secrets"), http.StatusNotFound, "instance_not_found", "in-1"},
		{"unknown instance", n1, nodePath(n1.id, "/instances/in-x/secrets"), http.StatusNotFound, "instance_not_found", "in-x"},
		{"instance naming none", n1, nodePath(n1.id, "/instances/in-none/secrets"), http.StatusNotFound, "instance_not_found", "in-none"},
		{"name the spec does not list", n1, nodePath(n1.id, "/instances/in-1/secrets?name=unlisted"), http.StatusNotFound, "secret_not_found", "in-1"},
		{"another node's path", n2, nodePath(n1.id, "/instances/in-1/secrets"), http.StatusForbidden, "node_mismatch", ""},
	} {
		code, ecode, body := e.nodeCall(tc.caller.client, http.MethodGet, tc.path, nil)
		if code != tc.status || ecode != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, code, body, tc.status, tc.code)
		}
		assertNoValue(t, tc.name, string(body), "pw-1")
		assertNoValue(t, tc.name, string(body), "nope")
		if tc.denied != "" && !e.auditHas("secret.fetch", tc.denied, "denied") {
			t.Errorf("%s: not audited as denied", tc.name)
		}
	}
	code, _, body := e.nodeCall(n1.client, http.MethodGet, nodePath(n1.id, "/instances/in-1/secrets?name=db-password"), nil)
	if code != http.StatusOK || !strings.Contains(string(body), base64.StdEncoding.EncodeToString([]byte("pw-1"))) {
		t.Errorf("?name=db-password: %d %s", code, body)
	}

	if st := e.op(http.MethodPost, "/api/v1/hosts/sec-n1/revoke", nil, nil); st != http.StatusOK {
		t.Fatalf("revoke: %d", st)
	}
	if code, ecode, _ := e.nodeCall(n1.client, http.MethodGet, nodePath(n1.id, "/instances/in-1/secrets"), nil); code != http.StatusForbidden ||
		ecode != "node_identity_revoked" {
		t.Errorf("revoked node: %d %s, want 403 node_identity_revoked", code, ecode)
	}
}

// fetchSecrets is node n's GET of instance iid's secrets: the answer's
// head and its body.
func (e *env) fetchSecrets(n nodeIdentity, iid string) (*http.Response, []byte) {
	e.t.Helper()
	resp, err := n.client.Get(e.nodeURL + nodePath(n.id, "/instances/"+iid+"/secrets"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp, raw
}

// auditDown is a store whose audit log refuses secret.fetch records while
// down is set.
type auditDown struct {
	store.Store
	mu   sync.Mutex
	down bool
}

func (a *auditDown) set(down bool) {
	a.mu.Lock()
	a.down = down
	a.mu.Unlock()
}

func (a *auditDown) AppendAudit(ctx context.Context, e store.AuditEvent) error {
	a.mu.Lock()
	down := a.down
	a.mu.Unlock()
	if down && e.Action == "secret.fetch" {
		return errors.New("audit table unavailable")
	}
	return a.Store.AppendAudit(ctx, e)
}

// TestSecretsFetchRefusedUnrecorded: a delivery of secrets whose
// secret.fetch record cannot be stored is refused (503 audit_unavailable,
// with Retry-After) and carries no value; once the audit log is back the
// same fetch is delivered and recorded.
func TestSecretsFetchRefusedUnrecorded(t *testing.T) {
	st := &auditDown{Store: openSQLite(t)}
	e := startEnv(t, st)
	n1 := e.enroll("sec-n1", e.createHost("sec-n1").Token)
	putInstance(t, st, "in-1", "sec-n1", "db-password")
	if code, raw := e.rawOp(http.MethodPut, "/api/v1/secrets/db-password", `{"value":"pw-unrecorded"}`); code != http.StatusCreated {
		t.Fatalf("set: %d %s", code, raw)
	}
	st.set(true)
	resp, raw := e.fetchSecrets(n1, "in-1")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(raw), `"audit_unavailable"`) ||
		resp.Header.Get("Retry-After") == "" {
		t.Errorf("fetch with the audit log down: %d (Retry-After %q) %s; want 503 audit_unavailable", resp.StatusCode,
			resp.Header.Get("Retry-After"), raw)
	}
	assertNoValue(t, "the refused answer", string(raw), "pw-unrecorded")

	st.set(false)
	code, _, body := e.nodeCall(n1.client, http.MethodGet, nodePath(n1.id, "/instances/in-1/secrets"), nil)
	if code != http.StatusOK || !strings.Contains(string(body), base64.StdEncoding.EncodeToString([]byte("pw-unrecorded"))) {
		t.Errorf("fetch with the audit log back: %d %s", code, body)
	}
	if !e.auditHas("secret.fetch", "in-1", "ok") {
		t.Error("the delivery is not audited")
	}
}

// secretsRT is the mock runtime recording the secrets each Create got.
type secretsRT struct {
	*mock.Runtime
	mu      sync.Mutex
	created map[string]map[string][]byte
}

func (r *secretsRT) Create(ctx context.Context, s runtime.Spec) (runtime.Status, error) {
	r.mu.Lock()
	r.created[s.ID] = s.Secrets
	r.mu.Unlock()
	return r.Runtime.Create(ctx, s)
}

func (r *secretsRT) got(id string) (map[string][]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.created[id]
	return s, ok
}

// TestSecretsDeliveredToAgent: a real agent on the mock runtime gets a
// secret set through the API (and, for a name the control plane does not
// hold, the file in NODE_AGENT_SECRETS_DIR) into the runtime's Create; an
// instance naming a secret neither has fails with secrets_missing before
// any Create; one naming a secret sealed with a KEK the control plane does
// not have fails with secrets_injection_failed, also before any Create.
// The value is in neither the agent's state directory nor its log, nor the
// control plane's, nor any answer of its instance, task, host or audit
// API.
func TestSecretsDeliveredToAgent(t *testing.T) {
	var cpLogs, agentLogs logBuf
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.Logger = cpLogs.logger() })
	value := "agent-s3cr3t-" + fmt.Sprint(time.Now().UnixNano())
	jv, _ := json.Marshal(value)
	if code, raw := e.rawOp(http.MethodPut, "/api/v1/secrets/db-password", `{"value":`+string(jv)+`}`); code != http.StatusCreated {
		t.Fatalf("set: %d %s", code, raw)
	}
	secretsDir, stateDir := t.TempDir(), t.TempDir()
	localValue := "local-only-value-" + fmt.Sprint(time.Now().UnixNano())
	if err := os.WriteFile(filepath.Join(secretsDir, "local-only"), []byte(localValue), 0o600); err != nil {
		t.Fatal(err)
	}
	// A file for a name the control plane holds is not used.
	if err := os.WriteFile(filepath.Join(secretsDir, "db-password"), []byte("stale-local-copy"), 0o600); err != nil {
		t.Fatal(err)
	}

	bt := e.createHost("sec-agent")
	rt := &secretsRT{Runtime: mock.New(mock.Options{Log: agentLogs.logger()}), created: map[string]map[string][]byte{}}
	a, err := agent.New(agent.Config{ControlPlaneURL: e.nodeURL, HostID: "sec-agent", BootstrapToken: bt.Token,
		CAHash: e.srv.CAHash(), OSFamily: "linux", StateDir: stateDir, ListenAddr: "127.0.0.1:0",
		HeartbeatInterval: 100 * time.Millisecond, ReconcileInterval: 200 * time.Millisecond, SecretsDir: secretsDir,
		Runtimes: runtime.Registry{mock.Name: mock.Entry()}},
		agent.WithLogger(agentLogs.logger()), agent.WithRuntime(rt), agent.WithAccelProbe(fixedAccel()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	e.waitHostStatus("sec-agent", api.HostHealthy, 10*time.Second)
	waitCapacity(t, e, "sec-agent")

	spec := api.InstanceSpec{Image: fakeImage, VCPUs: 1, MemoryMiB: 128, Secrets: []string{"db-password", "local-only"}}
	ok := e.createInstance(api.CreateInstanceRequest{Name: "with-secrets", HostID: "sec-agent", Spec: spec})
	e.waitPhase(ok.ID, api.InstanceReady, "", 10*time.Second)
	got, _ := rt.got(ok.ID)
	if string(got["db-password"]) != value || string(got["local-only"]) != localValue || len(got) != 2 {
		t.Errorf("the runtime's Create got %d secrets (db-password from the control plane: %t, local-only from the directory: %t)",
			len(got), string(got["db-password"]) == value, string(got["local-only"]) == localValue)
	}

	spec.Secrets = []string{"db-password", "nowhere"}
	bad := e.createInstance(api.CreateInstanceRequest{Name: "missing-secret", HostID: "sec-agent", Spec: spec})
	failed := e.waitPhase(bad.ID, api.InstanceFailed, api.ReasonSecretsMissing, 10*time.Second)
	if _, created := rt.got(bad.ID); created {
		t.Error("the runtime's Create ran for an instance with a missing secret")
	}
	if !strings.Contains(failed.Message, "nowhere") {
		t.Errorf("message %q does not name the missing secret", failed.Message)
	}
	assertNoValue(t, "the failed instance's message", failed.Message, value)

	// A value sealed with a KEK the control plane does not have (a
	// database restored from elsewhere, a KEK dropped from the ring too
	// early).
	foreignValue := "foreign-kek-value-" + fmt.Sprint(time.Now().UnixNano())
	foreignKey, err := kek.Generate()
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := kek.NewRing(foreignKey).Seal("workload_secret/foreign", []byte(foreignValue))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "foreign", Value: sealed, UpdatedBy: "test"}, nil); err != nil {
		t.Fatal(err)
	}
	spec.Secrets = []string{"foreign"}
	wrong := e.createInstance(api.CreateInstanceRequest{Name: "wrong-kek", HostID: "sec-agent", Spec: spec})
	failed = e.waitPhase(wrong.ID, api.InstanceFailed, api.ReasonSecretsInjectionFailed, 10*time.Second)
	if _, created := rt.got(wrong.ID); created {
		t.Error("the runtime's Create ran for an instance whose secret does not open")
	}
	if !strings.Contains(failed.Message, "control plane") {
		t.Errorf("message %q does not say the control plane's fetch failed", failed.Message)
	}
	t.Logf("wrong KEK: %s", failed.Message)

	// What the operator API shows of it all.
	var tasks []api.Task
	e.op(http.MethodGet, "/api/v1/tasks?limit=1000", nil, &tasks)
	paths := []string{"/api/v1/instances", "/api/v1/tasks?limit=1000", "/api/v1/hosts", "/api/v1/hosts/sec-agent",
		"/api/v1/audit?limit=1000", "/api/v1/secrets", "/api/v1/secrets/db-password", "/api/v1/secrets/foreign"}
	for _, id := range []string{ok.ID, bad.ID, wrong.ID} {
		paths = append(paths, "/api/v1/instances/"+id, "/api/v1/instances/"+id+"/events")
	}
	for _, tk := range tasks {
		paths = append(paths, "/api/v1/tasks/"+tk.ID)
	}
	for _, p := range paths {
		code, raw := e.rawOp(http.MethodGet, p, "")
		if code != http.StatusOK {
			t.Errorf("GET %s: %d %s", p, code, raw)
		}
		for _, v := range []string{value, localValue, foreignValue} {
			assertNoValue(t, "GET "+p, string(raw), v)
		}
	}
	stop()

	err = filepath.WalkDir(stateDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		assertNoValue(t, "agent state file "+p, string(b), value)
		assertNoValue(t, "agent state file "+p, string(b), localValue)
		assertNoValue(t, "agent state file "+p, string(b), foreignValue)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for where, text := range map[string]string{"the agent's log": agentLogs.String(), "the control plane's log": cpLogs.String()} {
		assertNoValue(t, where, text, value)
		assertNoValue(t, where, text, localValue)
		assertNoValue(t, where, text, foreignValue)
	}
	if !strings.Contains(agentLogs.String(), "agent running") {
		t.Error("the agent's log capture holds no 'agent running' line: is it working?")
	}
}
