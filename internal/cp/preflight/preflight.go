// Package preflight owns the stored preflight runs and the evidence
// bundles: POST /api/v1/preflight-runs validates and stores a preflight
// report (internal/wire/preflight) and tells the hosts room what it says
// about its host (last successful preflight, or api_unreachable for a
// stale host whose node-side API hop failed); GET lists and shows them; GET
// /api/v1/evidence/{correlation_id} streams a bounded tar.gz of everything
// the control plane holds under one correlation id (preflight runs, tasks
// with their events, audit records, terminal sessions) plus the agent's
// own diagnostics from a diag.collect task it queues and waits for. It
// must not authenticate callers (the server mounts it behind operator
// auth) or change a host except through Hosts.
package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/hosts"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// Store is what the room reads and writes: the preflight runs, and for
// evidence bundles the tasks, their events, audit records, terminal
// sessions and host records under one correlation id. store.Store
// satisfies it.
type Store interface {
	store.PreflightStore
	GetHost(ctx context.Context, id string) (store.Host, error)
	GetTask(ctx context.Context, id string) (store.Task, error)
	ListTasks(ctx context.Context, f store.TaskFilter) ([]store.Task, error)
	ListTaskEvents(ctx context.Context, taskID string) ([]store.TaskEvent, error)
	ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditEvent, error)
	ListTerminalSessions(ctx context.Context, f store.TerminalSessionFilter) ([]store.TerminalSession, error)
}

// Hosts applies a stored run to its host (hosts.Room.RecordPreflight).
type Hosts interface {
	RecordPreflight(ctx context.Context, o hosts.PreflightOutcome) error
}

// Tasks queues the evidence bundle's diag.collect (tasks.Room).
type Tasks interface {
	NewTask(ctx context.Context, nodeID, typ string, params json.RawMessage, ttl time.Duration) store.Task
	Enqueue(ctx context.Context, t store.Task) error
}

// Keys names the key that signs task envelopes (keys.Keys).
type Keys interface {
	SigningKID() string
}

// Config configures the room.
type Config struct {
	// CollectWait bounds how long an evidence bundle waits for its
	// diag.collect (default 15 s).
	CollectWait time.Duration
	Log         *slog.Logger
	Now         func() time.Time
}

// Room serves the preflight-run and evidence routes.
type Room struct {
	cfg   Config
	store Store
	hosts Hosts
	tasks Tasks
	keys  Keys
	audit *audit.Log
}

// New is the preflight room.
func New(cfg Config, st Store, h Hosts, t Tasks, k Keys, auditLog *audit.Log) *Room {
	if cfg.CollectWait == 0 {
		cfg.CollectWait = 15 * time.Second
	}
	return &Room{cfg: cfg, store: st, hosts: h, tasks: t, keys: k, audit: auditLog}
}

func runView(r store.PreflightRun, withReport bool) api.PreflightRun {
	v := api.PreflightRun{ID: r.ID, HostID: r.HostID, CorrelationID: r.CorrelationID, OK: r.OK,
		FailedHop: r.FailedHop, Signal: r.Signal, CreatedBy: r.CreatedBy, CreatedAt: r.CreatedAt}
	if withReport {
		v.Report = r.Report
	}
	return v
}

// Create is POST /api/v1/preflight-runs: body a preflight.Report.
func (s *Room) Create(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var rep preflight.Report
	if err := httpapi.DecodeJSON(r, &rep); err != nil {
		return err
	}
	if fields := Validate(rep); len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	if rep.CorrelationID == "" {
		rep.CorrelationID = httpapi.CorrelationID(ctx)
	}
	run, err := s.record(ctx, httpapi.NewID("pfr_"), rep, httpapi.Actor(ctx))
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, runView(run, false))
	return nil
}

// record stores rep as run id, audits it under actor and applies it to
// its host (last successful preflight, or api_unreachable for a stale host
// whose node-side API hop failed). rep is valid and has its correlation id.
func (s *Room) record(ctx context.Context, id string, rep preflight.Report, actor string) (store.PreflightRun, error) {
	raw, err := json.Marshal(rep)
	if err != nil {
		return store.PreflightRun{}, fmt.Errorf("encode preflight report: %w", err)
	}
	ok := rep.Classification.OK
	run := store.PreflightRun{ID: id, HostID: rep.NodeID, CorrelationID: rep.CorrelationID, OK: ok,
		FailedHop: string(rep.Classification.Hop), Signal: string(rep.Classification.Signal), Report: raw,
		CreatedBy: actor, CreatedAt: s.cfg.Now().UTC()}
	if err := s.store.CreatePreflightRun(ctx, run); err != nil {
		return store.PreflightRun{}, err
	}
	result := "passed"
	if !ok {
		result = "failed:" + run.FailedHop
	}
	s.audit.Record(ctx, audit.Entry{Actor: actor, Action: "preflight.run", Target: rep.NodeID, Result: result,
		CID: rep.CorrelationID, Detail: "run=" + run.ID + " signal=" + run.Signal})
	if rep.NodeID != "" {
		o := hosts.PreflightOutcome{HostID: rep.NodeID, RunID: run.ID, CorrelationID: rep.CorrelationID, OK: ok}
		for _, h := range rep.Hops {
			if h.Hop == signal.HopNodeRuntimeAPIReachability && h.Status == preflight.Failed {
				o.NodeAPIFailed, o.Signal, o.Detail = true, string(h.Signal), h.Detail
			}
		}
		if err := s.hosts.RecordPreflight(ctx, o); err != nil {
			s.cfg.Log.Warn("record preflight on host", "host_id", rep.NodeID, "run", run.ID, "err", err)
		}
	}
	return run, nil
}

// List is GET /api/v1/preflight-runs?host_id=&correlation_id= (newest
// first, without the reports).
func (s *Room) List(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	runs, err := s.store.ListPreflightRuns(r.Context(), store.PreflightFilter{HostID: q.Get("host_id"),
		CorrelationID: q.Get("correlation_id")})
	if err != nil {
		return err
	}
	out := make([]api.PreflightRun, 0, len(runs))
	for _, run := range runs {
		out = append(out, runView(run, false))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// Show is GET /api/v1/preflight-runs/{id}, with the report.
func (s *Room) Show(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	run, err := s.store.GetPreflightRun(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return httpapi.StoreError(err, "preflight_run", id)
	} else if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, runView(run, true))
	return nil
}
