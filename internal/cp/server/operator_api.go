package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	defaultTaskTTL = 10 * time.Minute
	maxTaskTTL     = 24 * time.Hour
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
	return withCorrelation(mux)
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		return errf(http.StatusServiceUnavailable, "store_unreachable", "store: %v", err)
	}
	select {
	case <-s.ready:
	default:
		return errf(http.StatusServiceUnavailable, "starting", "listeners not started")
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	return nil
}

// hashToken is the stored form of bootstrap and operator tokens. Tokens are
// 256-bit random, so a plain SHA-256 is enough.
func hashToken(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

func newToken(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	evs, err := s.store.ListAudit(r.Context(), store.AuditFilter{Target: q.Get("target"),
		CorrelationID: q.Get("correlation_id"), Limit: limit})
	if err != nil {
		return err
	}
	out := make([]api.AuditEvent, 0, len(evs))
	for _, e := range evs {
		out = append(out, api.AuditEvent{ID: e.ID, At: e.At, Actor: e.Actor, ActorTokenID: e.ActorTokenID,
			ActorRole: e.ActorRole, Action: e.Action, Target: e.Target, Result: e.Result,
			CorrelationID: e.CorrelationID, Detail: e.Detail})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) rotateSigningKey(w http.ResponseWriter, r *http.Request) error {
	kid, err := s.keys.rotate(r.Context())
	if err != nil {
		return err
	}
	s.audit(r.Context(), auditEntry{actor: actor(r.Context()), action: "signing_key.rotate", target: kid,
		result: "ok", cid: correlationID(r.Context())})
	writeJSON(w, http.StatusOK, map[string]any{"active_kid": kid, "jwks": s.keys.publicSet()})
	return nil
}

func (s *Server) listTaskTypes(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, s.cfg.Registry.Types())
	return nil
}
