package preflight

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/tasks"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Bounds on an evidence bundle.
const (
	maxEvidenceFile = 2 << 20 // one file, before compression
	maxEvidenceRows = 200     // tasks, audit records, sessions, runs
)

// The bundle's files.
const (
	filePreflight   = "preflight.json"
	fileTasks       = "tasks.json"
	fileAudit       = "audit.json"
	fileSessions    = "terminal-sessions.json"
	fileDiagnostics = "agent-diagnostics.json"
	fileManifest    = "manifest.json"
)

type evidenceSession struct {
	ID            string          `json:"session_id"`
	AllocationID  string          `json:"allocation_id"`
	NodeID        string          `json:"node_id"`
	TaskID        string          `json:"task_id,omitempty"`
	CorrelationID string          `json:"correlation_id"`
	State         string          `json:"state"`
	States        json.RawMessage `json:"states,omitempty"` // the readiness hops
	ErrorCode     string          `json:"error_code,omitempty"`
	ErrorMessage  string          `json:"error_message,omitempty"`
	CloseReason   string          `json:"close_reason,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
}

// Evidence is GET /api/v1/evidence/{correlation_id}: a tar.gz of what the
// control plane holds under the correlation id, and the agent's own
// diagnostics (a diag.collect task queued to the host, waited for at most
// CollectWait). What could not be collected is named in manifest.json; the
// bundle itself never fails for it.
func (s *Room) Evidence(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	cid := r.PathValue("correlation_id")
	if !httpapi.ValidCorrelationID(cid) {
		return httpapi.Invalid([]api.FieldError{{Field: "correlation_id", Message: "must be 1-128 characters of [A-Za-z0-9._:-]"}})
	}
	m := api.EvidenceManifest{CorrelationID: cid, CreatedAt: s.cfg.Now().UTC(), Missing: map[string]string{}}
	files := map[string][]byte{}
	put := func(name string, v any, err error) {
		if err != nil {
			m.Missing[name] = err.Error()
			v = []any{}
		}
		b, _ := json.MarshalIndent(v, "", "  ")
		if len(b) > maxEvidenceFile {
			b, m.Truncated = b[:maxEvidenceFile], append(m.Truncated, name)
		}
		files[name] = b
	}
	runs, err := s.store.ListPreflightRuns(ctx, store.PreflightFilter{CorrelationID: cid, Limit: maxEvidenceRows})
	runViews := make([]api.PreflightRun, 0, len(runs))
	for _, run := range runs {
		runViews = append(runViews, runView(run, true))
	}
	put(filePreflight, runViews, err)
	tasks, taskErr := s.tasksOf(ctx, cid)
	put(fileTasks, tasks, taskErr)
	events, err := s.store.ListAudit(ctx, store.AuditFilter{CorrelationID: cid, Limit: maxEvidenceRows})
	auditOut := make([]api.AuditEvent, 0, len(events))
	for _, e := range events {
		auditOut = append(auditOut, audit.View(e))
	}
	put(fileAudit, auditOut, err)
	sessions, err := s.sessionsOf(ctx, cid, tasks)
	put(fileSessions, sessions, err)

	host := hostOf(runs, tasks)
	diag, err := s.collect(ctx, cid, host)
	put(fileDiagnostics, diag, err)
	s.audit.Record(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "evidence.bundle", Target: host, Result: "ok",
		CID: cid, Detail: fmt.Sprintf("missing=%d", len(m.Missing))})

	names := []string{filePreflight, fileTasks, fileAudit, fileSessions, fileDiagnostics}
	for _, n := range names {
		m.Files = append(m.Files, api.EvidenceFile{Name: n, Bytes: int64(len(files[n]))})
	}
	if len(m.Missing) == 0 {
		m.Missing = nil
	}
	mb, _ := json.MarshalIndent(m, "", "  ")
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, n := range append([]string{fileManifest}, names...) {
		b := files[n]
		if n == fileManifest {
			b = mb
		}
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(b)), ModTime: m.CreatedAt}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", `attachment; filename="evidence-`+cid+`.tar.gz"`)
	_, _ = w.Write(buf.Bytes())
	return nil
}

// tasksOf returns the tasks under cid with their results, events and
// envelope metadata.
func (s *Room) tasksOf(ctx context.Context, cid string) ([]api.Task, error) {
	ts, err := s.store.ListTasks(ctx, store.TaskFilter{CorrelationID: cid, Limit: maxEvidenceRows})
	if err != nil {
		return nil, err
	}
	out := make([]api.Task, 0, len(ts))
	for _, t := range ts {
		v := tasks.View(t)
		v.Envelope = tasks.Envelope(t, s.keys.SigningKID())
		evs, err := s.store.ListTaskEvents(ctx, t.ID)
		if err != nil {
			return nil, err
		}
		for _, e := range evs {
			var te api.TaskEvent
			if json.Unmarshal(e.Event, &te) == nil {
				v.Events = append(v.Events, te)
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// sessionsOf returns the terminal sessions under cid or opened by one of
// its tasks, with their readiness hops.
func (s *Room) sessionsOf(ctx context.Context, cid string, tasks []api.Task) ([]evidenceSession, error) {
	seen := map[string]bool{}
	var out []evidenceSession
	add := func(f store.TerminalSessionFilter) error {
		ss, err := s.store.ListTerminalSessions(ctx, f)
		if err != nil {
			return err
		}
		for _, t := range ss {
			if seen[t.ID] {
				continue
			}
			seen[t.ID] = true
			out = append(out, evidenceSession{ID: t.ID, AllocationID: t.AllocationID, NodeID: t.NodeID, TaskID: t.TaskID,
				CorrelationID: t.CorrelationID, State: t.State, States: t.States, ErrorCode: t.ErrorCode,
				ErrorMessage: t.ErrorMessage, CloseReason: t.CloseReason, CreatedAt: t.CreatedAt})
		}
		return nil
	}
	if err := add(store.TerminalSessionFilter{CorrelationID: cid, Limit: maxEvidenceRows}); err != nil {
		return nil, err
	}
	for _, t := range tasks {
		if t.Type == task.TypeTerminalOpen {
			if err := add(store.TerminalSessionFilter{TaskID: t.ID, Limit: maxEvidenceRows}); err != nil {
				return nil, err
			}
		}
	}
	if out == nil {
		out = []evidenceSession{}
	}
	return out, nil
}

// hostOf is the host the correlation id is about: a preflight run's node,
// else the newest task's.
func hostOf(runs []store.PreflightRun, tasks []api.Task) string {
	for _, r := range runs {
		if r.HostID != "" {
			return r.HostID
		}
	}
	for _, t := range tasks {
		if t.NodeID != "" {
			return t.NodeID
		}
	}
	return ""
}

// collect queues diag.collect to host under cid and waits for its result
// at most CollectWait.
func (s *Room) collect(ctx context.Context, cid, host string) (*api.TaskResult, error) {
	if host == "" {
		return nil, errors.New("no host: no preflight run or task names one for this correlation id")
	}
	if _, err := s.store.GetHost(ctx, host); err != nil {
		return nil, fmt.Errorf("host %s: %v", host, err)
	}
	params, _ := json.Marshal(task.CollectParams{CorrelationID: cid})
	t := s.tasks.NewTask(ctx, host, task.TypeCollect, params, task.CollectTimeout+s.cfg.CollectWait)
	t.CorrelationID = cid
	if err := s.tasks.Enqueue(ctx, t); err != nil {
		return nil, fmt.Errorf("queue %s: %v", task.TypeCollect, err)
	}
	wait, cancel := context.WithTimeout(ctx, s.cfg.CollectWait)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := s.store.GetTask(ctx, t.ID)
		if err != nil {
			return nil, fmt.Errorf("%s task %s: %v", task.TypeCollect, t.ID, err)
		}
		if got.State.Terminal() {
			v := tasks.View(got)
			if got.State != api.TaskSucceeded || v.Result == nil {
				msg := ""
				if v.Result != nil && v.Result.Error != nil {
					msg = ": " + v.Result.Error.Code + " " + v.Result.Error.Message
				}
				return v.Result, fmt.Errorf("%s task %s %s%s", task.TypeCollect, t.ID, got.State, msg)
			}
			return v.Result, nil
		}
		select {
		case <-wait.Done():
			return nil, fmt.Errorf("%s task %s did not finish within %s (state %s)", task.TypeCollect, t.ID, s.cfg.CollectWait, got.State)
		case <-tick.C:
		}
	}
}
