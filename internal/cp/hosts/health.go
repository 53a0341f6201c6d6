package hosts

import (
	"context"
	"errors"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// HealthOutcome is what one finished diag.health_probe says about its
// host (internal/cp/healthsched decodes it from the task's result).
type HealthOutcome struct {
	HostID, TaskID, CorrelationID string
	Health                        api.HostHealth
	Summary                       string
	// At is when the probe finished.
	At time.Time
}

// RecordHealth applies a finished health probe to its host: the host's
// health, summary, time and task are the probe's (a probe older than the
// one recorded changes nothing). Unhealthy makes node_health_probe_unhealthy
// the host's last failure, keeping the first occurrence's time while the
// host stays unhealthy. A change of health is logged and audited
// (host.health, under the probe's correlation id, written with the
// change); the update writes only the health and failure columns and is
// a host change event (store.EventHost) for dashboards and caches.
// Unknown hosts are ignored.
func (s *Room) RecordHealth(ctx context.Context, o HealthOutcome) error {
	var prev api.HostHealth
	unlock := s.cache.lockWrite(o.HostID)
	defer unlock()
	err := s.store.UpdateHostHealth(ctx, o.HostID, func(h *store.HealthState) ([]store.AuditEvent, error) {
		if o.At.Before(h.Health.CheckedAt) {
			return nil, errNoChange
		}
		prev = h.Health.State
		if o.Health == api.HealthUnhealthy {
			f := store.Failure{Signal: string(signal.HealthProbeUnhealthy), Detail: bounded(o.Summary),
				CorrelationID: o.CorrelationID, At: o.At.UTC()}
			if prev == api.HealthUnhealthy && h.LastFailure.Signal == f.Signal && !h.LastFailure.At.IsZero() &&
				!h.LastFailure.At.After(f.At) {
				f.At = h.LastFailure.At
			}
			h.LastFailure = f
		}
		h.Health = store.Health{State: o.Health, Summary: bounded(o.Summary), CheckedAt: o.At.UTC(), TaskID: o.TaskID}
		if prev == o.Health {
			return nil, nil
		}
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: "system", Action: "host.health",
			Target: o.HostID, CID: o.CorrelationID, Result: string(o.Health),
			Detail: "from=" + orDefault(string(prev), "none") + " to=" + string(o.Health) + " task=" + o.TaskID +
				" summary=" + o.Summary})}, nil
	})
	switch {
	case errors.Is(err, errNoChange) || errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	s.cache.invalidate(o.HostID) // its last failure may have changed
	if prev != o.Health {
		s.log.Info("host health changed", "host_id", o.HostID, "from", orDefault(string(prev), "none"), "to", o.Health,
			"summary", o.Summary, "task_id", o.TaskID, "correlation_id", o.CorrelationID)
	}
	return nil
}
