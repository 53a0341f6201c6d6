package server

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestCreateTokenAPI: POST /api/v1/tokens with role and ttl/expires_at, its
// defaults and field errors.
func TestCreateTokenAPI(t *testing.T) {
	e := newRoleEnv(t)
	now := e.clock.Now()
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
			if st, _, body := e.do(t, http.MethodGet, "/api/v1/hosts", tok.Token, ""); st != http.StatusOK {
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
	e := newRoleEnv(t)
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
		tok, err := e.s.CreateOperatorToken(ctx, OperatorTokenSpec{Name: name, Role: tt.mint})
		if tt.ok {
			if err != nil || tok.Role != tt.mint {
				t.Errorf("%q minting %s: %+v %v", tt.caller, tt.mint, tok, err)
			}
			continue
		}
		he, isHTTP := err.(*httpapi.Error)
		if !isHTTP || he.Status != http.StatusForbidden || he.Code != "operator_role_forbidden" {
			t.Errorf("%q minting %s: %v, want 403 operator_role_forbidden", tt.caller, tt.mint, err)
		}
	}
}

// TestAuditCarriesTokenAndRole: what a token does is audited as
// operator:<name> with the token's id and role; a refused call is audited
// too; entries by other actors in the same request carry no token.
func TestAuditCarriesTokenAndRole(t *testing.T) {
	e := newRoleEnv(t)
	op, viewer := e.tokens[api.RoleOperator], e.tokens[api.RoleViewer]
	if st, _, body := e.do(t, http.MethodPost, "/api/v1/hosts", op.Token, `{"host_id":"web-1","os_family":"linux"}`); st != http.StatusCreated {
		t.Fatalf("create host: %d %s", st, body)
	}
	if st, _, _ := e.do(t, http.MethodPost, "/api/v1/hosts/web-1/revoke", op.Token, ""); st != http.StatusForbidden {
		t.Fatalf("operator revoking a host: %d, want 403", st)
	}
	ctx := httpapi.WithPrincipal(t.Context(), httpapi.Principal{TokenID: viewer.ID, Name: viewer.Name, Role: api.RoleViewer})
	e.s.audit.Record(ctx, audit.Entry{Actor: "system", Action: "probe.system"})
	e.s.audit.Record(ctx, audit.Entry{Actor: "operator:" + viewer.Name, Action: "probe.viewer"})

	evs, err := e.st.ListAudit(t.Context(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		actor, tokenID string
		role           api.Role
		target, result string
	}
	got := map[string]row{}
	for _, ev := range evs {
		got[ev.Action] = row{ev.Actor, ev.ActorTokenID, ev.ActorRole, ev.Target, ev.Result}
	}
	want := map[string]row{
		"host.create":        {"operator:tok-operator", op.ID, api.RoleOperator, "web-1", "ok"},
		"operator.forbidden": {"operator:tok-operator", op.ID, api.RoleOperator, "POST /api/v1/hosts/{id}/revoke", "forbidden"},
		"probe.system":       {"system", "", "", "", ""},
		"probe.viewer":       {"operator:tok-viewer", viewer.ID, api.RoleViewer, "", ""},
	}
	for action, w := range want {
		if g, ok := got[action]; !ok || g != w {
			t.Errorf("audit %s: %+v, want %+v", action, g, w)
		}
	}
	// The tokens minted at start-up had no principal: "system", no token.
	if g := got["token.create"]; g.actor != "system" || g.tokenID != "" || g.role != "" {
		t.Errorf("offline token.create audited as %+v", g)
	}

	// GET /api/v1/audit shows the same fields.
	st, _, body := e.do(t, http.MethodGet, "/api/v1/audit?target=web-1", e.tokens[api.RoleViewer].Token, "")
	var out []api.AuditEvent
	if err := json.Unmarshal(body, &out); st != http.StatusOK || err != nil {
		t.Fatalf("audit: %d %v %s", st, err, body)
	}
	i := slices.IndexFunc(out, func(ev api.AuditEvent) bool { return ev.Action == "host.create" })
	if i < 0 || out[i].ActorTokenID != op.ID || out[i].ActorRole != api.RoleOperator {
		t.Fatalf("audit API: %+v", out)
	}
}
