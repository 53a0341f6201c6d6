package termgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/periodic"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// Replica crash: every live session this replica holds has a lease in the
// store (store.TerminalLeaseStore) that it renews every leaseTTL/4 and
// deletes when the session ends. A replica that dies stops renewing; once
// the lease is past, any replica's sweeper (every leaseTTL/4) marks the
// session failed with gateway_error, so a session is never left open
// longer than leaseTTL + leaseTTL/4 (under the node-stream timeout) after
// its replica died. A store without leases (none today) disables this.

// errSessionClosed aborts the sweeper's update of a session that ended.
var errSessionClosed = errors.New("terminal session already closed")

// leaseTTL is how long a lease outlives its last renewal: two thirds of
// the node-stream timeout, so renewal period plus sweep period stay under it.
func (s *Gateway) leaseTTL() time.Duration { return s.cfg.NodeStreamTimeout * 2 / 3 }

// leases is the store's lease port, or nil.
func (s *Gateway) leases() store.TerminalLeaseStore {
	ls, _ := s.store.(store.TerminalLeaseStore)
	return ls
}

// replicaName names this replica in leases and failure messages.
func (s *Gateway) replicaName() string {
	if s.cfg.AdvertiseURL != "" {
		return s.cfg.AdvertiseURL
	}
	return "the control plane replica that held it"
}

// holdLease writes the lease of a session this replica now holds.
func (s *Gateway) holdLease(ctx context.Context, sid string) {
	ls := s.leases()
	if ls == nil {
		return
	}
	if err := ls.RenewTerminalLease(context.WithoutCancel(ctx), store.TerminalLease{SessionID: sid, Replica: s.replicaName(),
		LeaseUntil: s.now().UTC().Add(s.leaseTTL())}); err != nil {
		s.log.Warn("write terminal session lease", "session_id", sid, "err", err)
	}
}

// dropLease deletes the lease of a session that ended here.
func (s *Gateway) dropLease(ctx context.Context, sid string) {
	if ls := s.leases(); ls != nil {
		if err := ls.DeleteTerminalLease(context.WithoutCancel(ctx), sid); err != nil {
			s.log.Warn("delete terminal session lease", "session_id", sid, "err", err)
		}
	}
}

// runLeases renews this replica's leases and sweeps expired ones until ctx
// ends.
func (s *Gateway) runLeases(ctx context.Context) {
	if s.leases() == nil {
		return
	}
	periodic.Run(ctx, s.leaseTTL()/4, s.log, "terminal session leases", func(ctx context.Context) error {
		for _, sid := range s.term.ids() {
			s.holdLease(ctx, sid)
		}
		s.sweepLeases(ctx)
		return nil
	})
}

// sweepLeases fails the still-open sessions whose lease expired (their
// replica stopped renewing it) and deletes those leases. A session this
// replica holds is skipped: its lease is renewed on the next tick.
func (s *Gateway) sweepLeases(ctx context.Context) {
	ls := s.leases()
	expired, err := ls.ExpiredTerminalLeases(ctx, s.now().UTC(), 100)
	if err != nil {
		s.log.Warn("sweep terminal session leases", "err", err)
		return
	}
	for _, l := range expired {
		if s.term.has(l.SessionID) {
			continue
		}
		if err := s.failOrphan(ctx, l); err != nil && !errors.Is(err, errSessionClosed) && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("fail orphaned terminal session", "session_id", l.SessionID, "err", err)
			continue
		}
		if err := ls.DeleteTerminalLease(ctx, l.SessionID); err != nil {
			s.log.Warn("delete orphaned terminal session lease", "session_id", l.SessionID, "err", err)
		}
	}
}

// failOrphan marks an open session whose replica died failed
// (gateway_error), in one transaction so that two sweepers record it once.
func (s *Gateway) failOrphan(ctx context.Context, l store.TerminalLease) error {
	now := s.now().UTC()
	msg := fmt.Sprintf("the control plane replica holding this session (%s) stopped renewing its lease at %s; "+
		"the session ended with it", l.Replica, l.LeaseUntil.Add(-s.leaseTTL()).Format(time.RFC3339))
	code := terminal.CodeGatewayError
	ts, err := s.store.UpdateTerminalSession(ctx, l.SessionID, func(t *store.TerminalSession) error {
		if !t.ClosedAt.IsZero() {
			return errSessionClosed
		}
		var evs []api.TerminalStateEvent
		_ = json.Unmarshal(t.States, &evs)
		evs = append(evs, api.TerminalStateEvent{State: string(terminal.StateFailed), At: now,
			ElapsedMS: now.Sub(t.CreatedAt).Milliseconds(), Detail: string(code) + ": " + msg})
		b, err := json.Marshal(evs)
		if err != nil {
			return err
		}
		t.States, t.State = b, string(terminal.StateFailed)
		t.ErrorCode, t.ErrorMessage, t.CloseReason, t.ClosedAt = string(code), msg, string(code), now
		return nil
	})
	if err != nil {
		return fmt.Errorf("fail terminal session %q whose replica died: %w", l.SessionID, err)
	}
	s.metrics.Sessions.WithLabelValues(string(code)).Inc()
	s.log.Warn("terminal session failed: its replica died", "session_id", ts.ID, "correlation_id", ts.CorrelationID,
		"replica", l.Replica)
	s.audit.Record(ctx, audit.Entry{Actor: "terminal-gateway", Action: "terminal.replica_lost", Target: ts.ID,
		Result: string(code), CID: ts.CorrelationID, Detail: msg})
	return nil
}

// ids lists the live sessions' ids.
func (g *termGateway) ids() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.byID))
	for id := range g.byID {
		out = append(out, id)
	}
	return out
}

// has reports whether session id is live here.
func (g *termGateway) has(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.byID[id]
	return ok
}
