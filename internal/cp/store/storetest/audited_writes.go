package storetest

import (
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

// Operator tokens and workload secrets are created, revoked, set and
// deleted with their audit records in one transaction (ADR 0016): a
// security event is never stored without its record, and a refused one
// leaves none.
func init() {
	miscCases = append(miscCases,
		testCase{"OperatorToken/Audited", testOperatorTokenAudited},
		testCase{"WorkloadSecret/Audited", testWorkloadSecretAudited},
	)
}

func testOperatorTokenAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	tok := store.OperatorToken{ID: "tok_1", Name: "ci", Role: "operator", TokenHash: "h1", CreatedAt: at(0)}
	must(t, s.CreateOperatorToken(ctx, tok, auditRecord("token.create", "tok_1")))
	dup := tok
	dup.ID = "tok_2" // the same name and hash
	wantErr(t, s.CreateOperatorToken(ctx, dup, auditRecord("token.create", "tok_2")), store.ErrConflict)
	must(t, s.RevokeOperatorToken(ctx, "tok_1", auditRecord("token.revoke", "tok_1")))
	wantErr(t, s.RevokeOperatorToken(ctx, "tok_9", auditRecord("token.revoke", "tok_9")), store.ErrNotFound)
	diff(t, "tok_1 records", recordsOf(t, s, "tok_1"), []string{"token.create", "token.revoke"})
	diff(t, "records of a refused create", recordsOf(t, s, "tok_2"), []string(nil))
	diff(t, "records of a refused revoke", recordsOf(t, s, "tok_9"), []string(nil))
}

func testWorkloadSecretAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	var seen []int64
	record := func(ws store.WorkloadSecret) []store.AuditEvent {
		seen = append(seen, ws.Version)
		return []store.AuditEvent{auditRecord("secret.set", ws.Name)}
	}
	for range 2 {
		_, err := s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "db", Value: []byte("sealed"), UpdatedBy: "op",
			UpdatedAt: at(time.Second)}, record)
		must(t, err)
	}
	diff(t, "versions the audit saw", seen, []int64{1, 2})
	must(t, s.DeleteWorkloadSecret(ctx, "db", auditRecord("secret.delete", "db")))
	wantErr(t, s.DeleteWorkloadSecret(ctx, "nope", auditRecord("secret.delete", "nope")), store.ErrNotFound)
	diff(t, "db records", recordsOf(t, s, "db"), []string{"secret.set", "secret.set", "secret.delete"})
	diff(t, "records of a refused delete", recordsOf(t, s, "nope"), []string(nil))
}
