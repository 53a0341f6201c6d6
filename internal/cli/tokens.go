package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TokenCmd groups operator token commands.
type TokenCmd struct {
	Create TokenCreateCmd `cmd:"" help:"Create an operator token (printed once)."`
	List   TokenListCmd   `cmd:"" help:"List operator tokens."`
	Revoke TokenRevokeCmd `cmd:"" help:"Revoke an operator token (irreversible; asks, or --yes)."`
}

// TokenCreateCmd creates an operator token, through the API or, with
// --store, directly in the database (to bootstrap a new deployment). The
// role defaults to operator through the API (which only an admin token may
// call) and to admin with --store: the first token must be able to create
// the others, and whoever can write the store holds every power already.
type TokenCreateCmd struct {
	APIFlags
	Name  string        `arg:"" help:"Token name, unique (shown in audit records)."`
	Role  string        `name:"role" placeholder:"ROLE" help:"viewer (read only), operator (everything but tokens, signing keys and host revoke) or admin. Default: operator; admin with --store."`
	TTL   time.Duration `name:"ttl" help:"Lifetime, e.g. 24h (default: no expiry)."`
	Store string        `name:"store" help:"Create directly in this store (sqlite:PATH or postgres://...) instead of through the API."`
	// KEKFlags open the store's private keys with --store, as the server
	// does (server.New loads, and on a fresh store creates, the CA).
	KEKFlags
}

// role is the role to ask for: --role, or the default for the path taken.
func (c *TokenCreateCmd) role() api.Role {
	switch {
	case c.Role != "":
		return api.Role(c.Role)
	case c.Store != "":
		return api.RoleAdmin
	}
	return api.RoleOperator
}

// Run implements the command.
func (c *TokenCreateCmd) Run(ctx context.Context, env *Env) error {
	var tok api.OperatorToken
	if c.Store != "" {
		st, err := openStore(ctx, c.Store, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		ring, err := c.ring(nil)
		if err != nil {
			return err
		}
		srv, err := server.New(ctx, server.Config{KEK: ring, InsecurePlaintextKeys: c.InsecurePlaintextKeys}, st)
		if err != nil {
			return err
		}
		spec := server.OperatorTokenSpec{Name: c.Name, Role: c.role(), TTL: c.TTL}
		if tok, err = srv.CreateOperatorToken(ctx, spec); err != nil {
			return err
		}
	} else {
		cl, err := c.client()
		if err != nil {
			return err
		}
		req := api.CreateOperatorTokenRequest{Name: c.Name, Role: c.role(), TTL: api.Duration(c.TTL)}
		if err := cl.call(ctx, http.MethodPost, "/api/v1/tokens", nil, req, &tok); err != nil {
			return err
		}
	}
	if c.JSON {
		return printJSON(env.Stdout, tok)
	}
	exp := "no expiry"
	if tok.ExpiresAt != nil {
		exp = "expires " + tok.ExpiresAt.Local().Format(time.DateTime)
	}
	fmt.Fprintf(env.Stdout, "operator token %s (%s, role %s, %s), shown once:\n%s\n", tok.ID, tok.Name, tok.Role, exp, tok.Token)
	return nil
}

// TokenListCmd lists tokens.
type TokenListCmd struct{ APIFlags }

// Run implements the command.
func (c *TokenListCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var toks []api.OperatorToken
	if err := cl.call(ctx, http.MethodGet, "/api/v1/tokens", nil, nil, &toks); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, toks)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "ID\tNAME\tROLE\tCREATED\tEXPIRES\tREVOKED")
	for _, t := range toks {
		exp := "never"
		if t.ExpiresAt != nil {
			exp = t.ExpiresAt.Local().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%t\n", t.ID, t.Name, t.Role, t.CreatedAt.Local().Format(time.DateTime), exp,
			t.Revoked)
	}
	return tw.Flush()
}

// TokenRevokeCmd revokes a token.
type TokenRevokeCmd struct {
	APIFlags
	Yes
	ID string `arg:"" name:"token-id"`
}

// Run implements the command.
func (c *TokenRevokeCmd) Run(ctx context.Context, env *Env) error {
	if err := c.confirm(env, fmt.Sprintf("Revoking operator token %s", c.ID), c.ID); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.call(ctx, http.MethodPost, "/api/v1/tokens/"+url.PathEscape(c.ID)+"/revoke", nil, nil, nil); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "revoked %s\n", c.ID)
	return nil
}

// KeysCmd groups signing key commands.
type KeysCmd struct {
	Rotate    KeysRotateCmd    `cmd:"" help:"Rotate the task-signing key (old keys stay in the JWKS for 48h; asks, or --yes)."`
	RotateKEK KeysRotateKEKCmd `cmd:"" name:"rotate-kek" help:"Re-encrypt the private keys in a store with a new key-encryption key (docs/runbooks/key-encryption.md)."`
}

// KeysRotateCmd rotates the signing key.
type KeysRotateCmd struct {
	APIFlags
	Yes
}

// Run implements the command.
func (c *KeysRotateCmd) Run(ctx context.Context, env *Env) error {
	if err := c.confirm(env, "Rotating the task-signing key", "rotate"); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	var out struct {
		ActiveKID string   `json:"active_kid"`
		JWKS      api.JWKS `json:"jwks"`
	}
	if err := cl.call(ctx, http.MethodPost, "/api/v1/signing-keys/rotate", nil, nil, &out); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, out)
	}
	fmt.Fprintf(env.Stdout, "active signing key %s; %d keys published\n", out.ActiveKID, len(out.JWKS.Keys))
	return nil
}

// AuditCmd lists audit records.
type AuditCmd struct {
	APIFlags
	Target        string `name:"target" help:"Only records for this target (host id, task id, ...)."`
	CorrelationID string `name:"correlation-id" help:"Only records with this correlation id."`
	Limit         int    `name:"limit" default:"100"`
}

// Run implements the command.
func (c *AuditCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	q := url.Values{"limit": {fmt.Sprint(c.Limit)}}
	if c.Target != "" {
		q.Set("target", c.Target)
	}
	if c.CorrelationID != "" {
		q.Set("correlation_id", c.CorrelationID)
	}
	var evs []api.AuditEvent
	if err := cl.call(ctx, http.MethodGet, "/api/v1/audit", q, nil, &evs); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, evs)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "AT\tACTOR\tROLE\tTOKEN\tACTION\tTARGET\tRESULT\tCORRELATION\tDETAIL")
	for _, e := range evs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.At.Local().Format("2006-01-02 15:04:05.000"), e.Actor,
			dash(string(e.ActorRole)), dash(e.ActorTokenID), e.Action, e.Target, e.Result, dash(e.CorrelationID), e.Detail)
	}
	return tw.Flush()
}

func sortStrings(s []string) []string { sort.Strings(s); return s }
