package server

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/dashboard"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
)

// OperatorHandler serves the operator API, health and metrics: exactly
// publicRoutes and operatorRoutes.
func (s *Server) OperatorHandler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.publicRoutes() {
		mux.Handle(rt.pattern, rt.h)
	}
	for _, rt := range s.operatorRoutes() {
		registerOperatorRoute(mux, s, rt)
	}
	return httpapi.WithCorrelation(mux)
}

// newDashboard builds the dashboard on a mux of exactly operatorRoutes:
// its pages call the operator API in-process with the session's token.
// With a KEK its sessions live in the store, so any replica serves them.
func (s *Server) newDashboard() *dashboard.UI {
	mux := http.NewServeMux()
	for _, rt := range s.operatorRoutes() {
		registerOperatorRoute(mux, s, rt)
	}
	a := &httpapi.Auth{Tokens: s.store, Now: s.cfg.Now, Log: s.log}
	cfg := dashboard.Config{API: httpapi.WithCorrelation(mux), Authenticate: a.Authenticate,
		Now: s.cfg.Now, Log: s.log, SecureCookies: strings.HasPrefix(s.cfg.PublicURL, "https://")}
	if s.cfg.KEK != nil { // sessions for every replica, their tokens sealed; in memory without a KEK (dev)
		cfg.Sessions, cfg.Sealer = s.store, s.cfg.KEK
	}
	return dashboard.New(cfg)
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		return httpapi.Errorf(http.StatusServiceUnavailable, "store_unreachable", "store: %v", err)
	}
	select {
	case <-s.ready:
	default:
		return httpapi.Errorf(http.StatusServiceUnavailable, "starting", "listeners not started")
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}

func (s *Server) rotateSigningKey(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	kid, err := s.keys.Rotate(ctx, func(kid string) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "signing_key.rotate",
			Target: kid, Result: "ok", CID: httpapi.CorrelationID(ctx)})}
	})
	if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"active_kid": kid, "jwks": s.keys.PublicSet()})
	return nil
}
