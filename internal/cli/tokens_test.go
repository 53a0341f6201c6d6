package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
)

// runCLI runs drover with args and returns the exit code, stdout and stderr.
func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Run(context.Background(), args, &Env{Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

var opTokenRE = regexp.MustCompile(`drv_op_[A-Za-z0-9_-]+`)

// TestTokenRoles: token create through the API with and without --role and
// --ttl, its refusals, and what a viewer token may do; token list and audit
// show roles and token ids.
func TestTokenRoles(t *testing.T) {
	apiURL, admin := startServer(t)
	as := func(tok string, args ...string) (int, string, string) {
		return runCLI(append(args, "--api", apiURL, "--token", tok)...)
	}
	var viewer string
	tests := []struct {
		name     string
		token    *string
		args     []string
		code     int
		contains []string // in stdout for code 0, stderr otherwise
	}{
		{"viewer with ttl", &admin, []string{"token", "create", "ci", "--role", "viewer", "--ttl", "24h"}, 0,
			[]string{"(ci, role viewer, expires "}},
		{"default role is operator", &admin, []string{"token", "create", "ops"}, 0, []string{"(ops, role operator, no expiry)"}},
		{"explicit admin", &admin, []string{"token", "create", "root2", "--role", "admin"}, 0, []string{"role admin"}},
		{"unknown role", &admin, []string{"token", "create", "bad", "--role", "root"}, 1, []string{"invalid_payload", "role:"}},
		{"duplicate name", &admin, []string{"token", "create", "ci"}, 1, []string{"token_name_taken"}},
		{"list shows roles", &admin, []string{"token", "list"}, 0, []string{"ROLE", "viewer", "operator", "admin"}},
		{"viewer reads", &viewer, []string{"hosts", "list"}, 0, []string{"HOST"}},
		{"viewer cannot write", &viewer, []string{"hosts", "create", "web-9"}, 1, []string{"operator_role_forbidden", "requires role operator"}},
		{"viewer cannot mint", &viewer, []string{"token", "create", "x"}, 1, []string{"operator_role_forbidden", "requires role admin"}},
		{"audit shows role and token", &admin, []string{"audit"}, 0, []string{"ROLE\tTOKEN", "operator:ci", "viewer", "operator.forbidden"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := as(*tt.token, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out, errOut)
			}
			where := out
			if code != 0 {
				where = errOut
			}
			if tt.name == "audit shows role and token" {
				where = strings.Join(strings.Fields(where), "\t") // columns are space-padded
			}
			for _, c := range tt.contains {
				if !strings.Contains(where, c) {
					t.Fatalf("output lacks %q:\nstdout: %s\nstderr: %s", c, out, errOut)
				}
			}
			if tt.name == "viewer with ttl" {
				if viewer = opTokenRE.FindString(out); viewer == "" {
					t.Fatalf("no token printed: %s", out)
				}
			}
		})
	}
}

// TestTokenCreateOffline: with --store (the bootstrap path) the default
// role is admin, and --role still applies.
func TestTokenCreateOffline(t *testing.T) {
	spec := "sqlite:" + filepath.Join(t.TempDir(), "d.db")
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"token", "create", "admin"}, 0, "(admin, role admin, no expiry)"},
		{[]string{"token", "create", "ro", "--role", "viewer", "--ttl", "1h"}, 0, "(ro, role viewer, expires "},
		{[]string{"token", "create", "admin"}, 1, "is taken"},
		{[]string{"token", "create", "x", "--role", "owner"}, 1, "role:"},
	}
	for _, tt := range tests {
		code, out, errOut := runCLI(append(tt.args, "--store", spec, "--insecure-plaintext-keys")...)
		where := out
		if code != 0 {
			where = errOut
		}
		if code != tt.code || !strings.Contains(where, tt.want) {
			t.Errorf("%v: exit %d (want %d), want %q in:\nstdout: %s\nstderr: %s", tt.args, code, tt.code, tt.want, out, errOut)
		}
	}
}

// TestCreateDevToken: drover dev's token is admin, and a second one (the
// token file was deleted, the database kept "dev") gets the next free name.
func TestCreateDevToken(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := server.New(ctx, server.Config{InsecurePlaintextKeys: true}, st)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dev", "dev-2", "dev-3"} {
		tok, err := createDevToken(ctx, srv)
		if err != nil {
			t.Fatal(err)
		}
		if tok.Name != want || tok.Role != api.RoleAdmin || tok.Token == "" {
			t.Fatalf("dev token %q role %q (token set: %v), want %q admin", tok.Name, tok.Role, tok.Token != "", want)
		}
	}
}
