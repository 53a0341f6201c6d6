// Package operators owns operator tokens: minting (the role and expiry
// rules, the rule that a token may not mint a role above its own), the
// /api/v1/tokens routes (list, create, revoke) and their audit records. It
// must not authenticate callers (the server mounts its handlers behind
// operator auth, httpapi.Auth, which reads the same tokens) or keep tokens
// anywhere but the Store; only a token's hash is stored.
package operators

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxTokenName bounds an operator token's name (it is shown in audit records).
const maxTokenName = 128

// Store is what the room needs of store.Store.
type Store interface {
	CreateOperatorToken(ctx context.Context, t store.OperatorToken, audit ...store.AuditEvent) error
	ListOperatorTokens(ctx context.Context) ([]store.OperatorToken, error)
	RevokeOperatorToken(ctx context.Context, id string, audit ...store.AuditEvent) error
}

// Room is the operator tokens room.
type Room struct {
	store Store
	audit *audit.Log
	now   func() time.Time
}

// New returns the room over st; now is the clock.
func New(st Store, auditLog *audit.Log, now func() time.Time) *Room {
	return &Room{store: st, audit: auditLog, now: now}
}

// TokenSpec is an operator token to mint.
type TokenSpec struct {
	Name string   // unique among operator tokens
	Role api.Role // required
	// At most one of TTL and ExpiresAt; neither: the token does not expire.
	TTL       time.Duration
	ExpiresAt time.Time
}

// validate returns the spec's field errors at now.
func (sp TokenSpec) validate(now time.Time) []api.FieldError {
	var fe []api.FieldError
	switch {
	case sp.Name == "":
		fe = append(fe, api.FieldError{Field: "name", Message: "required"})
	case len(sp.Name) > maxTokenName:
		fe = append(fe, api.FieldError{Field: "name", Message: fmt.Sprintf("at most %d bytes", maxTokenName)})
	case strings.IndexFunc(sp.Name, unicode.IsControl) >= 0:
		fe = append(fe, api.FieldError{Field: "name", Message: "no control characters"})
	}
	if !sp.Role.Valid() {
		fe = append(fe, api.FieldError{Field: "role", Message: fmt.Sprintf("%q is not a role: one of %s",
			sp.Role, joinRoles())})
	}
	switch {
	case sp.TTL < 0:
		fe = append(fe, api.FieldError{Field: "ttl", Message: "must not be negative"})
	case sp.TTL > 0 && !sp.ExpiresAt.IsZero():
		fe = append(fe, api.FieldError{Field: "expires_at", Message: "give ttl or expires_at, not both"})
	case !sp.ExpiresAt.IsZero() && !sp.ExpiresAt.After(now):
		fe = append(fe, api.FieldError{Field: "expires_at", Message: "must be in the future"})
	}
	return fe
}

func joinRoles() string {
	names := make([]string, len(api.Roles))
	for i, r := range api.Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// CreateToken mints an operator token; the token is returned once. It
// serves POST /api/v1/tokens, `drover dev` and `drover token create
// --store` (through server.Server.CreateOperatorToken).
//
// The minting rule: when ctx carries an authenticated operator token (an
// API call), the new token's role may not be above that token's role (403
// operator_role_forbidden; the route itself is admin-only). Without one
// (offline bootstrap, `drover dev`) any role may be minted: whoever can
// write the store already holds every power.
//
// Errors: 422 invalid_payload naming the field, 403 as above, and a
// wrapped store.ErrConflict when the name is taken.
func (s *Room) CreateToken(ctx context.Context, spec TokenSpec) (api.OperatorToken, error) {
	now := s.now().UTC()
	if fe := spec.validate(now); len(fe) > 0 {
		return api.OperatorToken{}, httpapi.Invalid(fe)
	}
	if p, ok := httpapi.PrincipalFrom(ctx); ok && !p.Role.AtLeast(spec.Role) {
		s.audit.Record(ctx, audit.Entry{Actor: p.Actor(), Action: "token.create", Result: "forbidden",
			CID: httpapi.CorrelationID(ctx), Detail: "name=" + spec.Name + " role=" + string(spec.Role)})
		return api.OperatorToken{}, httpapi.RoleForbidden(spec.Role, p)
	}
	raw := httpapi.NewToken("drv_op_")
	t := store.OperatorToken{ID: httpapi.NewID("tok_"), Name: spec.Name, Role: spec.Role, TokenHash: httpapi.HashToken(raw),
		CreatedAt: now, ExpiresAt: spec.ExpiresAt.UTC()}
	if spec.TTL > 0 {
		t.ExpiresAt = now.Add(spec.TTL)
	}
	detail := "name=" + t.Name + " role=" + string(t.Role)
	if !t.ExpiresAt.IsZero() {
		detail += " expires_at=" + t.ExpiresAt.Format(time.RFC3339)
	}
	rec := s.audit.Event(ctx, audit.Entry{Actor: orSystem(httpapi.Actor(ctx)), Action: "token.create", Target: t.ID, Result: "ok",
		CID: httpapi.CorrelationID(ctx), Detail: detail})
	if err := s.store.CreateOperatorToken(ctx, t, rec); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return api.OperatorToken{}, fmt.Errorf("operator token name %q is taken: %w", spec.Name, err)
		}
		return api.OperatorToken{}, fmt.Errorf("create operator token %q: %w", spec.Name, err)
	}
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
	v := api.OperatorToken{ID: t.ID, Name: t.Name, Role: t.Role, CreatedAt: t.CreatedAt, Revoked: t.Revoked}
	if !t.ExpiresAt.IsZero() {
		e := t.ExpiresAt
		v.ExpiresAt = &e
	}
	return v
}

// Create is POST /api/v1/tokens; the role defaults to operator.
func (s *Room) Create(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateOperatorTokenRequest
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	spec := TokenSpec{Name: req.Name, Role: req.Role, TTL: time.Duration(req.TTL)}
	if spec.Role == "" {
		spec.Role = api.RoleOperator
	}
	if req.ExpiresAt != nil {
		spec.ExpiresAt = *req.ExpiresAt
	}
	v, err := s.CreateToken(r.Context(), spec)
	if errors.Is(err, store.ErrConflict) {
		return &httpapi.Error{Status: http.StatusConflict, CodedError: api.CodedError{Code: "token_name_taken",
			Message: fmt.Sprintf("an operator token named %q exists", req.Name),
			Fields:  []api.FieldError{{Field: "name", Message: "already in use"}}}}
	} else if err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusCreated, v)
	return nil
}

// List is GET /api/v1/tokens (no secrets).
func (s *Room) List(w http.ResponseWriter, r *http.Request) error {
	toks, err := s.store.ListOperatorTokens(r.Context())
	if err != nil {
		return fmt.Errorf("list operator tokens: %w", err)
	}
	out := make([]api.OperatorToken, 0, len(toks))
	for _, t := range toks {
		out = append(out, tokenView(t))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// Revoke is POST /api/v1/tokens/{id}/revoke.
func (s *Room) Revoke(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	rec := s.audit.Event(r.Context(), audit.Entry{Actor: httpapi.Actor(r.Context()), Action: "token.revoke", Target: id,
		Result: "ok", CID: httpapi.CorrelationID(r.Context())})
	if err := s.store.RevokeOperatorToken(r.Context(), id, rec); err != nil {
		return httpapi.StoreError(err, "token", id)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
