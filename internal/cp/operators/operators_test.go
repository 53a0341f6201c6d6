package operators

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

// env is the room on SQLite, its routes behind operator auth as the server
// mounts them (plus GET /probe, viewer), and one token per role.
type env struct {
	room   *Room
	h      http.Handler
	clock  func() time.Time
	tokens map[api.Role]api.OperatorToken
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC().Truncate(time.Millisecond)
	clock := func() time.Time { return now }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	room := New(st, audit.New(st, clock, log), clock)
	auth := &httpapi.Auth{Tokens: st, Now: clock, Log: log}
	mux := http.NewServeMux()
	mux.Handle("GET /api/v1/tokens", auth.Require(api.RoleAdmin, room.List))
	mux.Handle("POST /api/v1/tokens", auth.Require(api.RoleAdmin, room.Create))
	mux.Handle("POST /api/v1/tokens/{id}/revoke", auth.Require(api.RoleAdmin, room.Revoke))
	mux.Handle("GET /probe", auth.Require(api.RoleViewer, func(w http.ResponseWriter, _ *http.Request) error {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{})
		return nil
	}))
	e := &env{room: room, h: httpapi.WithCorrelation(mux), clock: clock, tokens: map[api.Role]api.OperatorToken{}}
	for _, r := range api.Roles {
		tok, err := room.CreateToken(ctx, TokenSpec{Name: "tok-" + string(r), Role: r})
		if err != nil {
			t.Fatal(err)
		}
		e.tokens[r] = tok
	}
	return e
}

// do sends a request with bearer (none if empty) and decodes an error body.
func (e *env) do(t *testing.T, method, path, bearer, body string) (int, api.ErrorDetail, []byte) {
	t.Helper()
	return testutil.ServeAPI(t, e.h, method, path, bearer, body)
}

// TestCreateTokenAPI: POST /api/v1/tokens with role and ttl/expires_at, its
// defaults and field errors.
func TestCreateTokenAPI(t *testing.T) {
	e := newEnv(t)
	now := e.clock()
	future := now.Add(48 * time.Hour).Format(time.RFC3339Nano)
	past := now.Add(-time.Minute).Format(time.RFC3339Nano)
	tests := []struct {
		name    string
		body    string
		status  int
		code    string
		field   string        // the field error's field
		role    api.Role      // on 201
		expires time.Duration // on 201: from now; 0 = no expiry
	}{
		{"viewer with ttl", `{"name":"ci","role":"viewer","ttl":"24h"}`, 201, "", "", api.RoleViewer, 24 * time.Hour},
		{"default role operator", `{"name":"ops"}`, 201, "", "", api.RoleOperator, 0},
		{"admin with expires_at", `{"name":"adm","role":"admin","expires_at":"` + future + `"}`, 201, "", "", api.RoleAdmin, 48 * time.Hour},
		{"unknown role", `{"name":"x","role":"root"}`, 422, "invalid_payload", "role", "", 0},
		{"role is case-sensitive", `{"name":"x","role":"Admin"}`, 422, "invalid_payload", "role", "", 0},
		{"no name", `{"role":"viewer"}`, 422, "invalid_payload", "name", "", 0},
		{"control character in name", `{"name":"a\nb"}`, 422, "invalid_payload", "name", "", 0},
		{"negative ttl", `{"name":"x","ttl":"-1h"}`, 422, "invalid_payload", "ttl", "", 0},
		{"ttl and expires_at", `{"name":"x","ttl":"1h","expires_at":"` + future + `"}`, 422, "invalid_payload", "expires_at", "", 0},
		{"expires_at in the past", `{"name":"x","expires_at":"` + past + `"}`, 422, "invalid_payload", "expires_at", "", 0},
		{"duplicate name", `{"name":"ci","role":"viewer"}`, 409, "token_name_taken", "name", "", 0},
		{"duplicate of a bootstrap name", `{"name":"tok-admin"}`, 409, "token_name_taken", "name", "", 0},
		{"unknown field", `{"name":"x","scope":"all"}`, 422, "invalid_json", "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, ed, body := e.do(t, http.MethodPost, "/api/v1/tokens", e.tokens[api.RoleAdmin].Token, tt.body)
			if st != tt.status || ed.Code != tt.code {
				t.Fatalf("%d %s, want %d %s", st, body, tt.status, tt.code)
			}
			if tt.field != "" && (len(ed.Fields) != 1 || ed.Fields[0].Field != tt.field) {
				t.Fatalf("fields %+v, want one naming %s", ed.Fields, tt.field)
			}
			if st != http.StatusCreated {
				return
			}
			var tok api.OperatorToken
			if err := json.Unmarshal(body, &tok); err != nil {
				t.Fatal(err)
			}
			if tok.Role != tt.role || tok.Token == "" || tok.ID == "" {
				t.Fatalf("token %+v, want role %s and a secret", tok, tt.role)
			}
			switch {
			case tt.expires == 0 && tok.ExpiresAt != nil:
				t.Fatalf("expires_at %v, want none", tok.ExpiresAt)
			case tt.expires != 0 && (tok.ExpiresAt == nil || !tok.ExpiresAt.Equal(now.Add(tt.expires))):
				t.Fatalf("expires_at %v, want %v", tok.ExpiresAt, now.Add(tt.expires))
			}
			// The new token works, with its role.
			if st, _, body := e.do(t, http.MethodGet, "/probe", tok.Token, ""); st != http.StatusOK {
				t.Fatalf("new token: %d %s", st, body)
			}
		})
	}
	st, _, body := e.do(t, http.MethodGet, "/api/v1/tokens", e.tokens[api.RoleAdmin].Token, "")
	var list []api.OperatorToken
	if err := json.Unmarshal(body, &list); st != http.StatusOK || err != nil {
		t.Fatalf("list: %d %v %s", st, err, body)
	}
	roles := map[string]api.Role{}
	for _, tok := range list {
		if tok.Token != "" {
			t.Fatalf("list shows the secret of %s", tok.Name)
		}
		roles[tok.Name] = tok.Role
	}
	want := map[string]api.Role{"tok-viewer": api.RoleViewer, "tok-operator": api.RoleOperator, "tok-admin": api.RoleAdmin,
		"ci": api.RoleViewer, "ops": api.RoleOperator, "adm": api.RoleAdmin}
	for n, r := range want {
		if roles[n] != r {
			t.Errorf("listed %s with role %q, want %q", n, roles[n], r)
		}
	}
}

// TestMintRule: a token may not mint a token with a higher role than its
// own; without an authenticated token (offline bootstrap) any role may be
// minted.
func TestMintRule(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		caller api.Role // "" = no principal
		mint   api.Role
		ok     bool
	}{
		{"", api.RoleAdmin, true},
		{api.RoleAdmin, api.RoleAdmin, true},
		{api.RoleAdmin, api.RoleViewer, true},
		{api.RoleOperator, api.RoleOperator, true},
		{api.RoleOperator, api.RoleViewer, true},
		{api.RoleOperator, api.RoleAdmin, false},
		{api.RoleViewer, api.RoleOperator, false},
		{api.RoleViewer, api.RoleAdmin, false},
	}
	for i, tt := range tests {
		ctx := t.Context()
		if tt.caller != "" {
			c := e.tokens[tt.caller]
			ctx = httpapi.WithPrincipal(ctx, httpapi.Principal{TokenID: c.ID, Name: c.Name, Role: tt.caller})
		}
		name := "m" + string(rune('a'+i))
		tok, err := e.room.CreateToken(ctx, TokenSpec{Name: name, Role: tt.mint})
		if tt.ok {
			if err != nil || tok.Role != tt.mint {
				t.Errorf("%q minting %s: %+v %v", tt.caller, tt.mint, tok, err)
			}
			continue
		}
		var he *httpapi.Error
		isHTTP := errors.As(err, &he)
		if !isHTTP || he.Status != http.StatusForbidden || he.Code != "operator_role_forbidden" {
			t.Errorf("%q minting %s: %v, want 403 operator_role_forbidden", tt.caller, tt.mint, err)
		}
	}
}
