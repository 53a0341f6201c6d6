package termgw

import (
	"context"
	"errors"
	"fmt"

	"github.com/drover-dev/drover/internal/cp/periodic"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// A live terminal session ends, on whichever replica holds it, when what
// authorised it goes away: its node is revoked or disabled, its allocation
// is no longer active, or the operator token that minted its terminal token
// is revoked. The store's change events (LISTEN/NOTIFY on PostgreSQL,
// in-process on SQLite) name the host, allocation or token; the replica
// re-reads the record for the sessions it holds that depend on it and ends
// those no longer allowed, with an error frame and a 4xxx close. Nothing is
// read per frame. A sweep every Terminal.RecheckInterval catches what a
// lost event (a dropped LISTEN connection) would miss.

// Event ends the live sessions a store change event revokes. The
// store is re-read off the event loop.
func (s *Gateway) Event(ctx context.Context, ev store.Event) {
	var keep func(*liveSession) bool
	switch ev.Kind {
	case store.EventHost:
		keep = func(l *liveSession) bool { return l.nodeID == ev.ID }
	case store.EventAllocation:
		keep = func(l *liveSession) bool { return l.allocID == ev.ID }
	case store.EventOperatorToken:
		keep = func(l *liveSession) bool { return l.mintedBy != "" && l.mintedBy == ev.ID }
	case store.EventResync: // revocations may have been lost
		keep = func(*liveSession) bool { return true }
	default:
		return
	}
	if ls := s.term.matching(keep); len(ls) > 0 {
		go s.recheckTerminals(ctx, ls)
	}
}

// Run re-reads every live session's node, allocation and
// minting token each Terminal.RecheckInterval.
func (s *Gateway) Run(ctx context.Context) {
	periodic.Run(ctx, s.cfg.RecheckInterval, s.log, "recheck terminals", func(ctx context.Context) error {
		s.recheckTerminals(ctx, s.term.matching(func(*liveSession) bool { return true }))
		return nil
	})
}

// recheckTerminals ends the sessions of ls that may no longer run.
func (s *Gateway) recheckTerminals(ctx context.Context, ls []*liveSession) {
	for _, l := range ls {
		if code, msg := s.liveRevoked(ctx, l); code != "" {
			s.log.Info("terminal session revoked", "session_id", l.id, "node_id", l.nodeID,
				"allocation_id", l.allocID, "code", code, "msg", msg)
			s.metrics.Revoked.WithLabelValues(string(code)).Inc()
			l.end(code, msg)
		}
	}
}

// liveRevoked reads what authorises l and returns why it may no longer
// run, or "" when it may (or when the store cannot tell: a read error
// keeps the session, and the next event or sweep decides).
func (s *Gateway) liveRevoked(ctx context.Context, l *liveSession) (terminal.ErrorCode, string) {
	h, err := s.store.GetHost(ctx, l.nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return terminal.CodeTerminalRevoked, fmt.Sprintf("node %q no longer exists", l.nodeID)
	case err != nil:
		s.logRecheck(ctx, l, err)
		return "", ""
	case h.Revoked:
		return terminal.CodeTerminalRevoked, fmt.Sprintf("node %q was revoked", l.nodeID)
	case !h.Enabled:
		return terminal.CodeTerminalRevoked, fmt.Sprintf("node %q was disabled", l.nodeID)
	}
	a, err := s.store.GetAllocation(ctx, l.allocID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return terminal.CodeAllocationInactive, fmt.Sprintf("allocation %q no longer exists", l.allocID)
	case err != nil:
		s.logRecheck(ctx, l, err)
		return "", ""
	case a.State != api.AllocationActive:
		return terminal.CodeAllocationInactive, fmt.Sprintf("allocation %q is %s", l.allocID, a.State)
	}
	if l.mintedBy == "" {
		return "", ""
	}
	tok, err := s.store.GetOperatorToken(ctx, l.mintedBy)
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && tok.Revoked:
		return terminal.CodeTerminalRevoked, fmt.Sprintf("the operator token %q that opened this terminal was revoked", l.mintedBy)
	case err != nil:
		s.logRecheck(ctx, l, err)
	}
	return "", ""
}

func (s *Gateway) logRecheck(ctx context.Context, l *liveSession, err error) {
	if ctx.Err() == nil {
		s.log.Warn("recheck terminal session", "session_id", l.id, "err", err)
	}
}
