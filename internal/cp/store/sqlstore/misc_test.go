package sqlstore

import "testing"

// TestAuditInsertRows: the statement for one record is auditInsert, and
// each further record takes the next ten placeholders.
func TestAuditInsertRows(t *testing.T) {
	if got := auditInsertRows(1); got != auditInsert {
		t.Errorf("one record:\n%s\nwant\n%s", got, auditInsert)
	}
	want := `INSERT INTO audit (id, at, actor, actor_token_id, actor_role, action, target, result, correlation_id, detail) VALUES ` +
		`($1, $2, $3, $4, $5, $6, $7, $8, $9, $10), ($11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`
	if got := auditInsertRows(2); got != want {
		t.Errorf("two records:\n%s\nwant\n%s", got, want)
	}
}
