package dashboard

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
)

// SessionStore keeps the sessions where every replica reads them
// (store.Store has it).
type SessionStore interface {
	CreateDashboardSession(ctx context.Context, s store.DashboardSession, keep int) error
	GetDashboardSession(ctx context.Context, idHash string) (store.DashboardSession, error)
	DeleteDashboardSession(ctx context.Context, idHash string) error
	DeleteExpiredDashboardSessions(ctx context.Context, now time.Time) (int, error)
}

// Sealer encrypts a session's operator token at rest (kek.Ring has it):
// name binds the sealed value to its session.
type Sealer interface {
	Seal(name string, plaintext []byte) ([]byte, error)
	Open(name string, sealed []byte) ([]byte, error)
}

// shared says the sessions live in the store, for every replica.
func (u *UI) shared() bool { return u.cfg.Sessions != nil && u.cfg.Sealer != nil }

// sealName is the associated data of a session's sealed token.
func sealName(idHash string) string { return "dashboard_session/" + idHash }

// keep stores a new session under the hash of its cookie: in the store
// (its token sealed) when shared, otherwise in this replica's memory. Its
// operator token keeps at most maxSessionsPerToken sessions: the oldest
// beyond end, so that one token's logins neither grow the store without
// bound nor lock others out. It reports false when this replica holds
// maxSessions already (in memory).
func (u *UI) keep(ctx context.Context, key string, s *session) (bool, error) {
	now := u.cfg.Now()
	if u.shared() {
		if _, err := u.cfg.Sessions.DeleteExpiredDashboardSessions(ctx, now); err != nil {
			return false, err
		}
		sealed, err := u.cfg.Sealer.Seal(sealName(key), []byte(s.token))
		if err != nil {
			return false, err
		}
		return true, u.cfg.Sessions.CreateDashboardSession(ctx, store.DashboardSession{IDHash: key, TokenID: s.p.TokenID,
			Token: sealed, CSRF: s.csrf, CreatedAt: now, ExpiresAt: s.expires}, maxSessionsPerToken)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	var same []string // the token's live sessions
	for k, old := range u.byHash {
		switch {
		case !now.Before(old.expires):
			delete(u.byHash, k)
		case old.p.TokenID == s.p.TokenID:
			same = append(same, k)
		}
	}
	if len(same) >= maxSessionsPerToken { // every session lives SessionTTL: the oldest expires first
		slices.SortFunc(same, func(a, b string) int { return u.byHash[a].expires.Compare(u.byHash[b].expires) })
		for _, k := range same[:len(same)-maxSessionsPerToken+1] {
			delete(u.byHash, k)
		}
	}
	if len(u.byHash) >= maxSessions {
		return false, nil
	}
	u.byHash[key] = s
	return true, nil
}

// lookup is the live session stored under key, or nil. A shared session
// is read from the store and its token authenticated again, so a logout
// on any replica, or the token's revocation, ends it at once.
func (u *UI) lookup(r *http.Request, key string) *session {
	now := u.cfg.Now()
	if !u.shared() {
		u.mu.Lock()
		defer u.mu.Unlock()
		s := u.byHash[key]
		if s != nil && !now.Before(s.expires) {
			delete(u.byHash, key)
			return nil
		}
		return s
	}
	ctx := r.Context()
	log := httpapi.Logger(ctx, u.cfg.Log)
	ds, err := u.cfg.Sessions.GetDashboardSession(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		log.Warn("dashboard session not read", "err", err)
		return nil
	case !now.Before(ds.ExpiresAt):
		return nil
	}
	token, err := u.cfg.Sealer.Open(sealName(key), ds.Token)
	if err != nil { // sealed with a KEK no longer configured, or damaged
		log.Warn("dashboard session token does not open; the browser logs in again", "err", err)
		return nil
	}
	p, err := u.cfg.Authenticate(ctx, string(token))
	if err != nil { // revoked or expired
		return nil
	}
	return &session{token: string(token), p: p, csrf: ds.CSRF, expires: ds.ExpiresAt}
}

// forget ends the session stored under key, on every replica when shared.
func (u *UI) forget(ctx context.Context, key string) error {
	if u.shared() {
		return u.cfg.Sessions.DeleteDashboardSession(context.WithoutCancel(ctx), key)
	}
	u.mu.Lock()
	delete(u.byHash, key)
	u.mu.Unlock()
	return nil
}
