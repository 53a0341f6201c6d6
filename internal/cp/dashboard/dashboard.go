// Package dashboard is the server-rendered operator dashboard under /ui/
// (login, fleet, host detail, tasks, instances, allocations with their
// terminals and replays, audit): html/template pages behind a server-side
// session cookie, with a CSRF token on every form.
//
// Every page's data comes from the public operator API: the dashboard calls
// the same handlers in-process (Config.API) with the session's operator
// token as its bearer token, so the UI, the CLI and the API never disagree
// and every role check and audit record is the API's own. Sessions live in
// the store, their operator tokens sealed with the key-encryption key, so
// any replica serves them and a logout ends them everywhere (a KEK
// rotation seals them again: ResealSessions); a replica without a KEK keeps
// them in its memory (a restart or another replica asks for the token
// again).
package dashboard

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	sessionCookie = "drover_session"
	loginCookie   = "drover_login_csrf" // the login form's double-submit token
	csrfField     = "csrf"
	// SessionTTL is how long a session lasts without a new login.
	SessionTTL = 12 * time.Hour
	// maxSessions and maxStreams bound the in-memory sessions and the live
	// fleet streams of one replica.
	maxSessions = 10000
	// maxSessionsPerToken bounds one operator token's sessions (a login
	// beyond ends its oldest).
	maxSessionsPerToken = 32
	maxStreams          = 64
)

// Config is what the dashboard needs from the control plane.
type Config struct {
	// API serves the operator API routes (bearer-token auth and roles
	// included); the dashboard calls it in-process.
	API http.Handler
	// Authenticate resolves an operator token at login (its name and role).
	Authenticate func(ctx context.Context, token string) (httpapi.Principal, error)
	Now          func() time.Time
	Log          *slog.Logger
	// SecureCookies marks the cookies Secure on every request, not only
	// those that came over TLS: set when a proxy in front terminates TLS
	// (drover server --public-url https://...).
	SecureCookies bool
	// Sessions and Sealer, when both are set, keep the sessions in the
	// store with their tokens sealed, for every replica; otherwise they
	// live in this replica's memory.
	Sessions SessionStore
	Sealer   Sealer
}

// session is one logged-in browser.
type session struct {
	token   string // the operator token; never sent back to the browser
	p       httpapi.Principal
	csrf    string
	expires time.Time
}

// UI is the dashboard; its sessions are its only state.
type UI struct {
	cfg     Config
	mu      sync.Mutex
	byHash  map[string]*session // without Config.Sessions: keyed by the SHA-256 of the cookie value
	streams chan struct{}       // a slot per live fleet stream
	tmpl    *template.Template
}

// New returns the dashboard.
func New(cfg Config) *UI {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &UI{cfg: cfg, byHash: map[string]*session{}, streams: make(chan struct{}, maxStreams),
		tmpl: templates()}
}

// Route is one route of the dashboard, pattern with its method.
type Route struct {
	Pattern string
	Handler http.Handler
}

// Routes are the dashboard's routes, to mount on the operator listener
// next to the console's "GET /ui/".
func (u *UI) Routes() []Route {
	return []Route{
		{"GET /ui/login", http.HandlerFunc(u.loginPage)},
		{"POST /ui/login", http.HandlerFunc(u.login)},
		{"POST /ui/logout", u.withSession(u.logout)},
		{"GET /ui/fleet", u.withSession(u.fleetPage)},
		{"GET /ui/fleet/events", u.withSession(u.fleetEvents)},
		{"GET /ui/hosts/{id}", u.withSession(u.hostPage)},
		{"GET /ui/hosts/{id}/live", u.withSession(u.hostLivePage)}, // hostpage.go
		{"POST /ui/hosts/{id}/actions/{action}", u.withSession(u.hostAction)},
		{"GET /ui/evidence/{cid}", u.withSession(u.evidence)},
		{"GET /ui/tasks", u.withSession(u.tasksPage)},
		{"GET /ui/tasks/{id}", u.withSession(u.taskPage)},
		{"GET /ui/audit", u.withSession(u.auditPage)},
		{"GET /ui/audit/export", u.withSession(u.auditExport)},
		{"GET /ui/instances", u.withSession(u.instancesPage)}, // instancepages.go
		{"GET /ui/instances/{id}", u.withSession(u.instancePage)},
		{"GET /ui/instances/{id}/logs", u.withSession(u.instanceLogs)}, // instancelogs.go
		{"POST /ui/instances/{id}/actions/{action}", u.withSession(u.instanceAction)},
		{"GET /ui/allocations", u.withSession(u.allocationsPage)}, // allocpages.go
		{"GET /ui/allocations/{id}", u.withSession(u.allocationPage)},
		{"GET /ui/allocations/{id}/terminal", u.withSession(u.terminalPage)},
		{"POST /ui/allocations/{id}/terminal-token", u.withSession(u.mintTerminalToken)},
		{"GET /ui/sessions/{sid}/replay", u.withSession(u.replayPage)},
		{"GET /ui/sessions/{sid}/recording", u.withSession(u.recording)},
	}
}

func randomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func hashOf(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:])
}

func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// setCookie sets an HttpOnly, SameSite=Strict cookie scoped to /ui/,
// Secure when the request came over TLS or the dashboard is served behind
// a TLS-terminating proxy (Config.SecureCookies). maxAge < 0 deletes it.
func (u *UI) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/ui/", MaxAge: maxAge, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || u.cfg.SecureCookies})
}

// sessionOf is the request's live session, or nil.
func (u *UI) sessionOf(r *http.Request) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil
	}
	return u.lookup(r, hashOf(c.Value))
}

// withSession serves h for a logged-in browser; others go to the login
// page (GET) or get 401. A POST must carry the session's CSRF token in
// its form (403 otherwise).
func (u *UI) withSession(h func(http.ResponseWriter, *http.Request, *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		s := u.sessionOf(r)
		if s == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
				return
			}
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
			if !sameToken(s.csrf, r.PostFormValue(csrfField)) {
				http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
				return
			}
		}
		h(w, r, s)
	})
}

func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
}

func (u *UI) loginPage(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	tok := randomToken()
	u.setCookie(w, r, loginCookie, tok, 600)
	u.render(w, http.StatusOK, "login", map[string]any{"CSRF": tok, "Error": r.URL.Query().Get("error")})
}

// login checks the double-submit token, resolves the operator token and
// starts a session.
func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	c, err := r.Cookie(loginCookie)
	if err != nil || !sameToken(c.Value, r.PostFormValue(csrfField)) {
		http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
		return
	}
	p, err := u.cfg.Authenticate(r.Context(), r.PostFormValue("token"))
	if err != nil {
		http.Redirect(w, r, "/ui/login?error=invalid", http.StatusSeeOther)
		return
	}
	cookie := randomToken()
	s := &session{token: r.PostFormValue("token"), p: p, csrf: randomToken(), expires: u.cfg.Now().Add(SessionTTL)}
	kept, err := u.keep(r.Context(), hashOf(cookie), s)
	if err != nil {
		cid := correlationOf(r)
		u.cfg.Log.Error("dashboard session not stored", "err", err, "correlation_id", cid)
		http.Error(w, "the session could not be stored (correlation id "+cid+")", http.StatusServiceUnavailable)
		return
	}
	if !kept {
		http.Error(w, "too many sessions", http.StatusServiceUnavailable)
		return
	}
	u.setCookie(w, r, loginCookie, "", -1)
	u.setCookie(w, r, sessionCookie, cookie, int(SessionTTL/time.Second))
	u.cfg.Log.Info("dashboard login", "operator", p.Name, "role", p.Role)
	http.Redirect(w, r, "/ui/fleet", http.StatusSeeOther)
}

// endSession forgets the request's session.
func (u *UI) endSession(r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		if err := u.forget(r.Context(), hashOf(c.Value)); err != nil {
			httpapi.Logger(r.Context(), u.cfg.Log).Warn("dashboard session not removed", "err", err)
		}
	}
}

// logout ends the session on every replica; if the store cannot remove
// it, the browser is told so (the session stays valid until it expires)
// instead of being shown the login page as if it had ended.
func (u *UI) logout(w http.ResponseWriter, r *http.Request, _ *session) {
	c, _ := r.Cookie(sessionCookie) // withSession found it
	if err := u.forget(r.Context(), hashOf(c.Value)); err != nil {
		cid := correlationOf(r)
		u.cfg.Log.Error("dashboard logout: session not removed", "err", err, "correlation_id", cid)
		http.Error(w, "logout failed: the session could not be removed; try again (correlation id "+cid+")",
			http.StatusServiceUnavailable)
		return
	}
	u.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// correlationOf is the request's correlation id (the operator listener
// gives every request one), or a new one to report an error under.
func correlationOf(r *http.Request) string {
	if cid := httpapi.CorrelationID(r.Context()); cid != "" {
		return cid
	}
	return httpapi.NewID("cid_")
}

// recorder is the in-process response of an API call.
type recorder struct {
	hdr    http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.hdr }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

// apiError is a non-2xx answer of the API.
type apiError struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// call calls the operator API in-process with the session's token and
// decodes a 2xx answer into out.
func (u *UI) call(r *http.Request, s *session, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	rec, err := u.send(r, s, method, path, body)
	if err != nil || out == nil {
		return err
	}
	return json.Unmarshal(rec.body.Bytes(), out)
}

// send calls the operator API in-process with the session's token (body,
// when not nil, is JSON) and returns a 2xx answer as it came; any other
// answer is an *apiError with the API's code and message.
func (u *UI) send(r *http.Request, s *session, method, path string, body io.Reader) (*recorder, error) {
	req, err := http.NewRequestWithContext(r.Context(), method, path, body)
	if err != nil {
		return nil, err
	}
	req.RemoteAddr = r.RemoteAddr
	req.Header.Set("Authorization", "Bearer "+s.token)
	if cid := r.Header.Get(api.HeaderCorrelationID); httpapi.ValidCorrelationID(cid) {
		req.Header.Set(api.HeaderCorrelationID, cid) // the browser's, as the console sends it
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := &recorder{hdr: http.Header{}}
	u.cfg.API.ServeHTTP(rec, req)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.status/100 != 2 {
		e := &apiError{Status: rec.status}
		var env struct {
			Error apiError `json:"error"`
		}
		if json.Unmarshal(rec.body.Bytes(), &env) == nil && env.Error.Code != "" {
			e.Code, e.Message = env.Error.Code, env.Error.Message
		} else {
			e.Message = rec.body.String()
		}
		return nil, e
	}
	return rec, nil
}

// canAct reports whether the session's role may use action controls.
func (s *session) canAct() bool { return s.p.Role.AtLeast(api.RoleOperator) }

// CanAct, Name, Role and CSRF are what the templates see of a session.
func (s *session) CanAct() bool { return s.canAct() }

// Name is the operator token's name.
func (s *session) Name() string { return s.p.Name }

// Role is the operator token's role.
func (s *session) Role() api.Role { return s.p.Role }

// CSRF is the session's CSRF token, for every form's hidden field.
func (s *session) CSRF() string { return s.csrf }
