package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// getAs is GET path with token as the bearer token ("" sends none); it
// returns the status and the body.
func (e *env) getAs(token, path string) (int, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.opURL+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.opHTTP.Do(req)
	if err != nil {
		e.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// eventLine is what an instance event says, for comparing histories.
func eventLine(ev api.InstanceEvent) string {
	s := ev.Actor + " " + string(ev.DesiredState) + " " + string(ev.Phase)
	if ev.ReasonCode != "" {
		s += "/" + string(ev.ReasonCode)
	}
	return s
}

// TestInstanceEventsAPI drives GET /api/v1/instances/{id}/events through
// an instance's life: created, booted, ready, stopped, deleted. Only
// changes of phase or reason and operator desired-state changes are
// recorded; identical, runtime-only and stale reports are not.
func TestInstanceEventsAPI(t *testing.T) {
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.VCPUAllocationRatio = 1 })
	a := startAPINode(e, "node-a")
	var in api.Instance
	if st := e.op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "ev1", HostID: "node-a",
		Spec: apiSpec(1, 256)}, &in); st != http.StatusCreated {
		t.Fatalf("create: HTTP %d", st)
	}
	report := func(rep api.InstanceStatusReport) {
		t.Helper()
		if st, code := a.report(in.ID, rep); st != http.StatusOK {
			t.Fatalf("report %+v: %d %s", rep, st, code)
		}
	}
	report(api.InstanceStatusReport{Generation: 1, Phase: api.InstanceBooting})
	report(api.InstanceStatusReport{Generation: 1, Phase: api.InstanceBooting}) // identical
	report(api.InstanceStatusReport{Generation: 1, Phase: api.InstanceReady, Runtime: &api.InstanceRuntime{Runtime: "mock", PID: 1}})
	report(api.InstanceStatusReport{Generation: 1, Phase: api.InstanceReady, Runtime: &api.InstanceRuntime{Runtime: "mock", PID: 2}})
	if st := e.op(http.MethodPost, "/api/v1/instances/"+in.ID+"/stop", nil, nil); st != http.StatusOK {
		t.Fatalf("stop: HTTP %d", st)
	}
	if st := e.op(http.MethodPost, "/api/v1/instances/"+in.ID+"/stop", nil, nil); st != http.StatusOK { // no change
		t.Fatalf("stop again: HTTP %d", st)
	}
	report(api.InstanceStatusReport{Generation: 2, Phase: api.InstanceStopped, ReasonCode: api.ReasonTerminatedByOperator})
	report(api.InstanceStatusReport{Generation: 1, Phase: api.InstanceReady}) // stale

	var evs []api.InstanceEvent
	if st := e.op(http.MethodGet, "/api/v1/instances/ev1/events", nil, &evs); st != http.StatusOK { // by name
		t.Fatalf("events: HTTP %d", st)
	}
	var got []string
	for i, ev := range evs {
		got = append(got, eventLine(ev))
		if ev.Seq != int64(i+1) || ev.InstanceID != in.ID || ev.At.IsZero() || ev.CorrelationID == "" ||
			(i > 0 && ev.At.Before(evs[i-1].At)) {
			t.Errorf("event %d: %+v", i, ev)
		}
	}
	want := []string{"operator:test running Pending", "node:node-a running Booting", "node:node-a running Ready",
		"operator:test stopped Ready", "node:node-a stopped Stopped/terminated_by_operator"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if evs[3].Generation != 2 || evs[3].ObservedGeneration != 1 || evs[4].ObservedGeneration != 2 {
		t.Errorf("generations: stop %d/%d, stopped observed %d", evs[3].Generation, evs[3].ObservedGeneration, evs[4].ObservedGeneration)
	}

	viewer, err := e.srv.CreateOperatorToken(context.Background(), server.OperatorTokenSpec{Name: "ev-viewer", Role: api.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, token, path string
		status            int
		code              string
		n                 int
	}{
		{"viewer", viewer.Token, "/api/v1/instances/" + in.ID + "/events", http.StatusOK, "", 5},
		{"last two", viewer.Token, "/api/v1/instances/" + in.ID + "/events?limit=2", http.StatusOK, "", 2},
		{"limit at the bound", viewer.Token, "/api/v1/instances/" + in.ID + "/events?limit=200", http.StatusOK, "", 5},
		{"no token", "", "/api/v1/instances/" + in.ID + "/events", http.StatusUnauthorized, "", 0},
		{"unknown id", viewer.Token, "/api/v1/instances/i-000000000000/events", http.StatusNotFound, "instance_not_found", 0},
		{"limit 0", e.opToken, "/api/v1/instances/" + in.ID + "/events?limit=0", http.StatusUnprocessableEntity, "invalid_payload", 0},
		{"limit over 200", e.opToken, "/api/v1/instances/" + in.ID + "/events?limit=201", http.StatusUnprocessableEntity, "invalid_payload", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, body := e.getAs(c.token, c.path)
			if st != c.status {
				t.Fatalf("HTTP %d, want %d: %s", st, c.status, body)
			}
			if c.code != "" {
				var env struct {
					Error api.CodedError `json:"error"`
				}
				if json.Unmarshal(body, &env) != nil || env.Error.Code != c.code {
					t.Errorf("body %s, want code %s", body, c.code)
				}
			}
			if st == http.StatusOK {
				var page []api.InstanceEvent
				if err := json.Unmarshal(body, &page); err != nil || len(page) != c.n || page[len(page)-1].Seq != 5 {
					t.Errorf("page %s (%v), want the last %d", body, err, c.n)
				}
			}
		})
	}

	// Delete: recorded, then the agent's Stopped at the delete's
	// generation removes the record and its history with it.
	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("delete: HTTP %d", st)
	}
	e.op(http.MethodGet, "/api/v1/instances/"+in.ID+"/events", nil, &evs)
	if last := evs[len(evs)-1]; last.DesiredState != api.DesiredDeleted || last.Generation != 3 || last.Actor != "operator:test" {
		t.Errorf("delete event %+v", last)
	}
	report(api.InstanceStatusReport{Generation: 3, Phase: api.InstanceStopped, ReasonCode: api.ReasonTerminatedByOperator, At: time.Now()})
	if st, _ := e.getAs(e.opToken, "/api/v1/instances/"+in.ID+"/events"); st != http.StatusNotFound {
		t.Errorf("events of a removed instance: HTTP %d, want 404", st)
	}
	if n, err := e.st.ListInstanceEvents(context.Background(), in.ID, 0); err != nil || len(n) != 0 {
		t.Errorf("events outlived the record: %d %v", len(n), err)
	}
}

// eventProbe checks, as each instance create or update returns, that
// the record it wrote (a new instance; a new phase, reason, desired state
// or generation) is already in the events: a reader that sees it must
// find its event.
type eventProbe struct {
	store.Store
	mu     sync.Mutex
	missed []string
}

func (p *eventProbe) miss(format string, args ...any) {
	p.mu.Lock()
	p.missed = append(p.missed, fmt.Sprintf(format, args...))
	p.mu.Unlock()
}

func (p *eventProbe) CreateInstance(ctx context.Context, in store.Instance) error {
	p.miss("%s created without its event", in.Name)
	return p.Store.CreateInstance(ctx, in)
}

func (p *eventProbe) CreateInstanceRecorded(ctx context.Context, in store.Instance, ev store.InstanceEvent, audit ...store.AuditEvent) error {
	err := p.Store.CreateInstanceRecorded(ctx, in, ev, audit...)
	if err != nil {
		return err
	}
	if !p.audited(ctx, in.ID, "name="+in.Name) {
		p.miss("%s created without its audit record", in.Name)
	}
	if evs, lerr := p.Store.ListInstanceEvents(ctx, in.ID, 0); lerr != nil || len(evs) != 1 || evs[0].Phase != in.Phase ||
		evs[0].Generation != in.Generation {
		p.miss("%s created; events %+v, %v", in.Name, evs, lerr)
	}
	return nil
}

func (p *eventProbe) UpdateInstance(ctx context.Context, id string, fn func(*store.Instance) error) (store.Instance, error) {
	return p.UpdateInstanceRecorded(ctx, id, fn, nil)
}

func (p *eventProbe) UpdateInstanceRecorded(ctx context.Context, id string, fn func(*store.Instance) error,
	record func(before, after store.Instance) store.InstanceRecords) (store.Instance, error) {
	before, _ := p.Store.GetInstance(ctx, id)
	out, err := p.Store.UpdateInstanceRecorded(ctx, id, fn, record)
	if err != nil || (out.Phase == before.Phase && out.ReasonCode == before.ReasonCode && out.DesiredState == before.DesiredState &&
		out.Generation == before.Generation) {
		return out, err
	}
	if out.DesiredState != before.DesiredState && !p.audited(ctx, id, fmt.Sprintf("generation=%d", out.Generation)) {
		p.miss("%s desired %s at generation %d stored without its audit record", id, out.DesiredState, out.Generation)
	}
	evs, lerr := p.Store.ListInstanceEvents(ctx, id, 1)
	if lerr != nil || len(evs) == 0 || evs[0].Phase != out.Phase || evs[0].ReasonCode != out.ReasonCode ||
		evs[0].DesiredState != out.DesiredState || evs[0].Generation != out.Generation {
		p.miss("%s %s/%s desired %s generation %d (last event %+v, %v)", id, out.Phase, out.ReasonCode,
			out.DesiredState, out.Generation, evs, lerr)
	}
	return out, err
}

func (p *eventProbe) DeleteInstance(ctx context.Context, id string, audit ...store.AuditEvent) error {
	if err := p.Store.DeleteInstance(ctx, id, audit...); err != nil {
		return err
	}
	if !p.audited(ctx, id, "") {
		p.miss("%s deleted without its audit record", id)
	}
	return nil
}

// audited says whether id has an audit record whose detail holds detail.
func (p *eventProbe) audited(ctx context.Context, id, detail string) bool {
	evs, err := p.Store.ListAudit(ctx, store.AuditFilter{Target: id})
	for _, e := range evs {
		if err == nil && strings.Contains(e.Detail, detail) {
			return true
		}
	}
	return false
}

// TestInstanceTransitionsStoredWithEvents: an operator's create, a node's
// status report and an operator's stop and delete store the instance's
// event with the change, so a client that sees the new phase (as
// waitPhase does) always finds its event. (TestPresets runs the same probe
// over the agent-declared local workloads.)
func TestInstanceTransitionsStoredWithEvents(t *testing.T) {
	p := &eventProbe{Store: openSQLite(t)}
	e := startEnv(t, p, func(c *server.Config) { c.VCPUAllocationRatio = 1 })
	a := startAPINode(e, "node-a")
	var in api.Instance
	if st := e.op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "ev2", HostID: "node-a",
		Spec: apiSpec(1, 256)}, &in); st != http.StatusCreated {
		t.Fatalf("create: HTTP %d", st)
	}
	for _, rep := range []api.InstanceStatusReport{{Generation: 1, Phase: api.InstanceBooting}, {Generation: 1, Phase: api.InstanceReady}} {
		if st, code := a.report(in.ID, rep); st != http.StatusOK {
			t.Fatalf("report %+v: %d %s", rep, st, code)
		}
	}
	if st := e.op(http.MethodPost, "/api/v1/instances/"+in.ID+"/stop", nil, nil); st != http.StatusOK {
		t.Fatalf("stop: HTTP %d", st)
	}
	if st, code := a.report(in.ID, api.InstanceStatusReport{Generation: 2, Phase: api.InstanceStopped,
		ReasonCode: api.ReasonTerminatedByOperator}); st != http.StatusOK {
		t.Fatalf("report stopped: %d %s", st, code)
	}
	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusOK && st != http.StatusAccepted {
		t.Fatalf("delete: HTTP %d", st)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.missed) > 0 {
		t.Fatalf("transitions visible before their events:\n%s", strings.Join(p.missed, "\n"))
	}
}
