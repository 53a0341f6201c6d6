package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// HashToken is the stored form of bootstrap, operator and terminal tokens.
// Tokens are 256-bit random, so a plain SHA-256 is enough.
func HashToken(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// NewToken returns a 256-bit random token with a prefix, e.g. "drv_op_...".
func NewToken(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// Principal is the operator token a request authenticated with.
type Principal struct {
	TokenID, Name string
	Role          api.Role
}

// Actor is how audit records and created_by fields name the principal.
func (p Principal) Actor() string { return "operator:" + p.Name }

type principalKey struct{}

// PrincipalFrom is the request's principal, if it authenticated with an
// operator token.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// WithPrincipal returns ctx carrying p, and p's actor as the request's actor.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	ctx = context.WithValue(ctx, principalKey{}, p)
	return context.WithValue(ctx, ctxActor, p.Actor())
}

// TokenStore is what operator authentication reads.
type TokenStore interface {
	GetOperatorTokenByHash(ctx context.Context, hash string) (store.OperatorToken, error)
}

// Auth authenticates operator requests by bearer token.
type Auth struct {
	Tokens TokenStore
	Now    func() time.Time
	Log    *slog.Logger
	// Forbidden records a request refused because p's role is below need
	// (the control plane audits it); nil records nothing.
	Forbidden func(ctx context.Context, p Principal, route string, need api.Role)
}

// Require requires a valid operator bearer token whose role is at least
// min: 401 without a valid token, 403 operator_role_forbidden (recorded
// with Forbidden) with one whose role is too low.
func (a *Auth) Require(min api.Role, next HandlerFunc) http.Handler {
	return Handle(a.Log, func(w http.ResponseWriter, r *http.Request) error {
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || raw == "" {
			return Errorf(http.StatusUnauthorized, "operator_token_required", "missing operator bearer token (Authorization: Bearer ...)")
		}
		p, err := a.Authenticate(r.Context(), raw)
		if err != nil {
			return err
		}
		ctx := WithPrincipal(r.Context(), p)
		if !p.Role.AtLeast(min) {
			if a.Forbidden != nil {
				a.Forbidden(ctx, p, r.Pattern, min)
			}
			return RoleForbidden(min, p)
		}
		return next(w, r.WithContext(ctx))
	})
}

// Authenticate returns the principal of the raw operator token: 401
// operator_token_invalid for an unknown, revoked or expired one. Require
// uses it; so does the web dashboard's login, which learns the role there.
func (a *Auth) Authenticate(ctx context.Context, raw string) (Principal, error) {
	tok, err := a.Tokens.GetOperatorTokenByHash(ctx, HashToken(raw))
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, Errorf(http.StatusUnauthorized, "operator_token_invalid", "operator token is not valid")
	} else if err != nil {
		return Principal{}, err
	}
	if tok.Revoked || (!tok.ExpiresAt.IsZero() && !a.Now().Before(tok.ExpiresAt)) {
		return Principal{}, Errorf(http.StatusUnauthorized, "operator_token_invalid", "operator token is revoked or expired")
	}
	return Principal{TokenID: tok.ID, Name: tok.Name, Role: tok.Role}, nil
}

// RoleForbidden is the 403 of a principal whose role is below need.
func RoleForbidden(need api.Role, p Principal) *Error {
	return Errorf(http.StatusForbidden, "operator_role_forbidden",
		"requires role %s; operator token %q has role %s", need, p.Name, p.Role)
}
