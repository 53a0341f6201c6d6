package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/drover-dev/drover/internal/api"
	"github.com/drover-dev/drover/internal/store"
	"github.com/drover-dev/drover/internal/webui"
)

const (
	defaultTaskTTL = 10 * time.Minute
	maxTaskTTL     = 24 * time.Hour
)

// OperatorHandler serves the operator API, health and metrics.
func (s *Server) OperatorHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.Handle("GET /readyz", s.handle(s.readyz))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))

	op := func(f handlerFunc) http.Handler { return s.operatorAuth(f) }
	mux.Handle("GET /api/v1/hosts", op(s.listHosts))
	mux.Handle("POST /api/v1/hosts", op(s.createHost))
	mux.Handle("GET /api/v1/hosts/{id}", op(s.showHost))
	mux.Handle("POST /api/v1/hosts/{id}/enable", op(s.setHostEnabled(true)))
	mux.Handle("POST /api/v1/hosts/{id}/disable", op(s.setHostEnabled(false)))
	mux.Handle("POST /api/v1/hosts/{id}/rotate-token", op(s.rotateToken))
	mux.Handle("POST /api/v1/hosts/{id}/revoke", op(s.revokeHost))
	mux.Handle("GET /api/v1/hosts/{id}/slots", op(s.listSlots))
	mux.Handle("POST /api/v1/hosts/{id}/slots", op(s.approveSlots))
	mux.Handle("DELETE /api/v1/hosts/{id}/slots/{slot_id}", op(s.deleteSlot))
	mux.Handle("POST /api/v1/hosts/{id}/drain", op(s.setHostDraining(true)))
	mux.Handle("POST /api/v1/hosts/{id}/undrain", op(s.setHostDraining(false)))
	mux.Handle("POST /api/v1/placements/check", op(s.checkPlacement))
	mux.Handle("GET /api/v1/instances", op(s.listInstances))
	mux.Handle("POST /api/v1/instances", op(s.createInstance))
	mux.Handle("GET /api/v1/instances/{id}", op(s.showInstance))
	mux.Handle("POST /api/v1/instances/{id}/stop", op(s.setInstanceDesired(api.DesiredStopped)))
	mux.Handle("POST /api/v1/instances/{id}/start", op(s.setInstanceDesired(api.DesiredRunning)))
	mux.Handle("DELETE /api/v1/instances/{id}", op(s.deleteInstance))
	mux.Handle("POST /api/v1/instance-groups/{group}/scale", op(s.scaleGroup))
	mux.Handle("GET /api/v1/allocations", op(s.listAllocations))
	mux.Handle("POST /api/v1/allocations", op(s.createAllocation))
	mux.Handle("GET /api/v1/allocations/{id}", op(s.showAllocation))
	mux.Handle("DELETE /api/v1/allocations/{id}", op(s.releaseAllocation))
	mux.Handle("POST /api/v1/allocations/{id}/terminal-token", op(s.mintTerminalToken))
	mux.Handle("GET /api/v1/allocations/{id}/sessions", op(s.listAllocationSessions))
	mux.Handle("GET /api/v1/terminal-sessions/{sid}", op(s.showTerminalSession))
	mux.Handle("GET /api/v1/terminal-sessions/{sid}/recording", op(s.terminalRecording))
	// The browser's terminal leg: the single-use token (a subprotocol) is
	// its credential, not an operator bearer token.
	mux.HandleFunc("GET /api/v1/terminal", s.terminalWS)
	mux.Handle("GET /api/v1/tasks", op(s.listTasks))
	mux.Handle("POST /api/v1/tasks", op(s.enqueueTask))
	mux.Handle("GET /api/v1/tasks/{id}", op(s.showTask))
	mux.Handle("POST /api/v1/tasks/{id}/cancel", op(s.cancelTask))
	mux.Handle("GET /api/v1/task-types", op(s.listTaskTypes))
	mux.Handle("GET /api/v1/tokens", op(s.listTokens))
	mux.Handle("POST /api/v1/tokens", op(s.createToken))
	mux.Handle("POST /api/v1/tokens/{id}/revoke", op(s.revokeToken))
	mux.Handle("GET /api/v1/audit", op(s.listAudit))
	mux.Handle("POST /api/v1/signing-keys/rotate", op(s.rotateSigningKey))
	mux.Handle("GET /api/v1/ca", op(func(w http.ResponseWriter, _ *http.Request) error {
		writeJSON(w, http.StatusOK, map[string]string{"ca_hash": s.ca.Hash(), "ca_pem": string(s.ca.CertPEM()), "node_url": s.cfg.NodeURL})
		return nil
	}))
	// The web console: its pages call the API above from the browser.
	ui := webui.Handler()
	mux.Handle("GET /ui/", ui)
	mux.Handle("GET /{$}", ui) // "/" redirects to /ui/
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

// operatorAuth requires a valid operator bearer token.
func (s *Server) operatorAuth(next handlerFunc) http.Handler {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || raw == "" {
			return errf(http.StatusUnauthorized, "operator_token_required", "missing operator bearer token (Authorization: Bearer ...)")
		}
		tok, err := s.store.GetOperatorTokenByHash(r.Context(), hashToken(raw))
		if errors.Is(err, store.ErrNotFound) {
			return errf(http.StatusUnauthorized, "operator_token_invalid", "operator token is not valid")
		} else if err != nil {
			return err
		}
		if tok.Revoked || (!tok.ExpiresAt.IsZero() && !s.cfg.Now().Before(tok.ExpiresAt)) {
			return errf(http.StatusUnauthorized, "operator_token_invalid", "operator token is revoked or expired")
		}
		ctx := context.WithValue(r.Context(), ctxActor, "operator:"+tok.Name)
		return next(w, r.WithContext(ctx))
	})
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

// CreateOperatorToken mints an operator token directly (used by `drover
// dev` and `drover token create --local`); the token is returned once.
func (s *Server) CreateOperatorToken(ctx context.Context, name string, ttl time.Duration) (api.OperatorToken, error) {
	now := s.cfg.Now().UTC()
	raw := newToken("drv_op_")
	t := store.OperatorToken{ID: newID("tok_"), Name: name, TokenHash: hashToken(raw), CreatedAt: now}
	if ttl > 0 {
		t.ExpiresAt = now.Add(ttl)
	}
	if err := s.store.CreateOperatorToken(ctx, t); err != nil {
		return api.OperatorToken{}, err
	}
	s.audit(ctx, auditEntry{actor: orSystem(actor(ctx)), action: "token.create", target: t.ID, result: "ok",
		cid: correlationID(ctx), detail: "name=" + name})
	v := tokenView(t)
	v.Token = raw
	return v, nil
}

func orSystem(a string) string {
	if a == "" {
		return "system"
	}
	return a
}

func tokenView(t store.OperatorToken) api.OperatorToken {
	v := api.OperatorToken{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt, Revoked: t.Revoked}
	if !t.ExpiresAt.IsZero() {
		e := t.ExpiresAt
		v.ExpiresAt = &e
	}
	return v
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateOperatorTokenRequest
	if err := decodeJSON(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return invalid([]api.FieldError{{Field: "name", Message: "required"}})
	}
	v, err := s.CreateOperatorToken(r.Context(), req.Name, time.Duration(req.TTL))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, v)
	return nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	toks, err := s.store.ListOperatorTokens(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.OperatorToken, 0, len(toks))
	for _, t := range toks {
		out = append(out, tokenView(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.store.RevokeOperatorToken(r.Context(), id); err != nil {
		return storeErr(err, "token", id)
	}
	s.audit(r.Context(), auditEntry{actor: actor(r.Context()), action: "token.revoke", target: id, result: "ok",
		cid: correlationID(r.Context())})
	w.WriteHeader(http.StatusNoContent)
	return nil
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
		out = append(out, api.AuditEvent{ID: e.ID, At: e.At, Actor: e.Actor, Action: e.Action, Target: e.Target,
			Result: e.Result, CorrelationID: e.CorrelationID, Detail: e.Detail})
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
