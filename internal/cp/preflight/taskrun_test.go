package preflight

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/hosts"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/cp/taskbus"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

type fakeHosts struct{ got []hosts.PreflightOutcome }

func (f *fakeHosts) RecordPreflight(_ context.Context, o hosts.PreflightOutcome) error {
	f.got = append(f.got, o)
	return nil
}

// TestPreflightTaskStoresRun: a succeeded diag.preflight task's report is
// stored as a run of the task's node (not the node the report names),
// under the task's correlation id and by whoever queued it, and applied to
// the host; the same result again stores nothing new; a failed task, a
// task of another type and an invalid report store nothing.
func TestPreflightTaskStoresRun(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, sqlite.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := func() time.Time { return time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC) }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fh := &fakeHosts{}
	room := New(Config{Log: log, Now: now}, st, fh, nil, nil, audit.New(st, now, log))
	bus := taskbus.New()
	room.Subscribe(bus)

	report := func(failHop bool) json.RawMessage {
		rep := preflight.Report{Schema: preflight.SchemaVersion, CorrelationID: "other", NodeID: "someone-else",
			StartedAt: now(), FinishedAt: now(), Hops: []preflight.HopResult{
				{Hop: signal.HopNodeReadiness, Status: preflight.Passed},
				{Hop: signal.HopNodeRuntimeAPIReachability, Status: preflight.Passed},
			}}
		if failHop {
			rep.Hops[1].Fail(signal.APIUnreachable, "refused")
		}
		rep.Classify()
		b, _ := json.Marshal(rep)
		return b
	}
	finish := func(id, typ string, state api.TaskState, out json.RawMessage) {
		res := &api.TaskResult{Status: api.ResultSucceeded, Output: out}
		bus.PublishFinished(ctx, taskbus.Finished{Task: store.Task{ID: id, NodeID: "pf-host", Type: typ, State: state,
			CorrelationID: "cid-" + id, CreatedBy: "operator:alice"}, Result: res})
	}
	finish("tsk_ok", task.TypePreflight, api.TaskSucceeded, report(false))
	finish("tsk_ok", task.TypePreflight, api.TaskSucceeded, report(false)) // the same result twice
	finish("tsk_bad", task.TypePreflight, api.TaskSucceeded, report(true))
	finish("tsk_failed", task.TypePreflight, api.TaskFailed, report(false))
	finish("tsk_other", task.TypeHealthProbe, api.TaskSucceeded, report(false))
	finish("tsk_invalid", task.TypePreflight, api.TaskSucceeded, json.RawMessage(`{"schema":"nope","hops":[]}`))

	runs, err := st.ListPreflightRuns(ctx, store.PreflightFilter{HostID: "pf-host"})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 {
		t.Fatalf("runs %+v, want 2", runs)
	}
	byID := map[string]store.PreflightRun{}
	for _, r := range runs {
		byID[r.ID] = r
	}
	ok, bad := byID[TaskRunID("tsk_ok")], byID[TaskRunID("tsk_bad")]
	if !ok.OK || ok.CorrelationID != "cid-tsk_ok" || ok.CreatedBy != "operator:alice" || ok.HostID != "pf-host" {
		t.Errorf("passing run %+v", ok)
	}
	var stored preflight.Report
	if err := json.Unmarshal(ok.Report, &stored); err != nil || stored.NodeID != "pf-host" {
		t.Errorf("stored report node %q: %v", stored.NodeID, err)
	}
	if bad.OK || bad.FailedHop != string(signal.HopNodeRuntimeAPIReachability) || bad.Signal != string(signal.APIUnreachable) {
		t.Errorf("failing run %+v", bad)
	}
	if len(fh.got) != 2 || !fh.got[0].OK || fh.got[0].HostID != "pf-host" || fh.got[1].OK || !fh.got[1].NodeAPIFailed {
		t.Errorf("host outcomes %+v", fh.got)
	}
}
