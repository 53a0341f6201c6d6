package storetest

import (
	"database/sql"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pressly/goose/v3"

	"github.com/drover-dev/drover/internal/cp/store/migrations"
)

// rolesVersion is the migration that adds operator token roles and makes
// token names unique.
const rolesVersion = 5

// MigrateOperatorRoles checks migration 00005 on data written under the
// previous schema: existing tokens become admin, duplicate names are made
// unique (the oldest keeps its name), old audit records get no token, and
// the new constraints hold. db is an empty database of dialect.
func MigrateOperatorRoles(t *testing.T, db *sql.DB, dialect goose.Dialect) {
	t.Helper()
	ctx := ctxT(t)
	p, err := migrations.NewProvider(db, dialect)
	must(t, err)
	_, err = p.UpTo(ctx, rolesVersion-1)
	must(t, err)
	exec := func(q string, args ...any) error {
		_, err := db.ExecContext(ctx, q, args...)
		return err
	}
	for _, tok := range []struct {
		id, name string
		created  int64
	}{
		{"tok_2", "ci", 2000},
		{"tok_1", "ci", 1000}, // the oldest "ci" keeps its name
		{"tok_0", "ci", 2000},
		{"tok_b", "tie", 5000},
		{"tok_a", "tie", 5000}, // same created_at: the lower id keeps it
		{"tok_s", "solo", 3000},
	} {
		must(t, exec(`INSERT INTO operator_tokens (id, name, token_hash, created_at) VALUES ($1, $2, $3, $4)`,
			tok.id, tok.name, "hash-"+tok.id, tok.created))
	}
	must(t, exec(`INSERT INTO audit (id, at, actor, action) VALUES (1, 1, 'operator:ci', 'host.create')`))

	_, err = p.Up(ctx)
	must(t, err)
	type row struct{ ID, Name, Role string }
	tokens := func() []row {
		t.Helper()
		rows, err := db.QueryContext(ctx, `SELECT id, name, role FROM operator_tokens ORDER BY id`)
		must(t, err)
		defer rows.Close()
		var out []row
		for rows.Next() {
			var r row
			must(t, rows.Scan(&r.ID, &r.Name, &r.Role))
			out = append(out, r)
		}
		must(t, rows.Err())
		return out
	}
	want := []row{
		{"tok_0", "ci-tok_0", "admin"},
		{"tok_1", "ci", "admin"},
		{"tok_2", "ci-tok_2", "admin"},
		{"tok_a", "tie", "admin"},
		{"tok_b", "tie-tok_b", "admin"},
		{"tok_s", "solo", "admin"},
	}
	if d := cmp.Diff(want, tokens()); d != "" {
		t.Fatalf("tokens after migration (-want +got):\n%s", d)
	}
	var tokID, role string
	must(t, db.QueryRowContext(ctx, `SELECT actor_token_id, actor_role FROM audit WHERE id = 1`).Scan(&tokID, &role))
	if tokID != "" || role != "" {
		t.Fatalf("old audit record got token %q role %q", tokID, role)
	}
	if err := exec(`INSERT INTO operator_tokens (id, name, role, token_hash) VALUES ('tok_x', 'solo', 'viewer', 'hash-x')`); err == nil {
		t.Fatal("duplicate token name accepted after migration")
	}
	if err := exec(`INSERT INTO operator_tokens (id, name, role, token_hash) VALUES ('tok_y', 'y', 'root', 'hash-y')`); err == nil {
		t.Fatal("unknown role accepted after migration")
	}

	// Down drops what Up added and keeps the de-duplicated names; Up again.
	_, err = p.DownTo(ctx, rolesVersion-1)
	must(t, err)
	if err := exec(`INSERT INTO operator_tokens (id, name, token_hash) VALUES ('tok_z', 'solo', 'hash-z')`); err != nil {
		t.Fatalf("after down, names are no longer unique: %v", err)
	}
	must(t, exec(`DELETE FROM operator_tokens WHERE id = 'tok_z'`))
	_, err = p.Up(ctx)
	must(t, err)
	if d := cmp.Diff(want, tokens()); d != "" {
		t.Fatalf("tokens after down and up (-want +got):\n%s", d)
	}
}
