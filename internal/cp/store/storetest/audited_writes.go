package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Operator tokens and workload secrets are created, revoked, set and
// deleted with their audit records in one transaction (ADR 0016), and so
// are hosts (with their bootstrap token), allocations and terminal
// sessions (with their token): a security event is never stored without
// its record, and a refused one leaves none.
func init() {
	miscCases = append(miscCases,
		testCase{"OperatorToken/Audited", testOperatorTokenAudited},
		testCase{"WorkloadSecret/Audited", testWorkloadSecretAudited},
		testCase{"Host/CreateAudited", testHostCreateAudited},
		testCase{"Allocation/Audited", testAllocationAudited},
		testCase{"TerminalSession/CreateAudited", testTerminalCreateAudited},
	)
}

func testHostCreateAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	h := store.Host{ID: "h1", Enabled: true, TokenHash: "bt", CreatedAt: at(0)}
	must(t, s.CreateHost(ctx, h, auditRecord("host.create", "h1"), auditRecord("token.bootstrap_issue", "h1")))
	wantErr(t, s.CreateHost(ctx, h, auditRecord("host.create", "h1")), store.ErrConflict)
	diff(t, "h1 records", recordsOf(t, s, "h1"), []string{"host.create", "token.bootstrap_issue"})
	got, err := s.GetHost(ctx, "h1")
	must(t, err)
	diff(t, "h1's token hash", got.TokenHash, "bt")
}

func testAllocationAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	a := store.Allocation{ID: "a-1", Username: "u", HostID: "h1", CreatedAt: at(0)}
	must(t, s.CreateAllocation(ctx, a, auditRecord("allocation.create", "a-1")))
	wantErr(t, s.CreateAllocation(ctx, a, auditRecord("allocation.create", "a-1")), store.ErrConflict)
	var saw []api.AllocationState
	release := func(a store.Allocation) []store.AuditEvent {
		saw = append(saw, a.State)
		return []store.AuditEvent{auditRecord("allocation.release", a.ID)}
	}
	_, err := s.UpdateAllocationAudited(ctx, "a-1", func(a *store.Allocation) error {
		a.State, a.UpdatedAt = api.AllocationReleasing, at(time.Second)
		return nil
	}, release)
	must(t, err)
	refused := errors.New("no change")
	_, err = s.UpdateAllocationAudited(ctx, "a-1", func(*store.Allocation) error { return refused }, release)
	wantErr(t, err, refused)
	_, err = s.UpdateAllocationAudited(ctx, "a-9", func(*store.Allocation) error { return nil }, release)
	wantErr(t, err, store.ErrNotFound)
	diff(t, "states the audit saw", saw, []api.AllocationState{api.AllocationReleasing})
	diff(t, "a-1 records", recordsOf(t, s, "a-1"), []string{"allocation.create", "allocation.release"})
	diff(t, "records of a missing allocation", recordsOf(t, s, "a-9"), []string(nil))
}

func testTerminalCreateAudited(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	must(t, s.CreateTerminalSession(ctx, newTerminal("s-1", "a-1", "hash-1", 0), auditRecord("terminal.token_mint", "s-1")))
	// The same token hash: refused, and recorded nowhere.
	wantErr(t, s.CreateTerminalSession(ctx, newTerminal("s-2", "a-1", "hash-1", 0), auditRecord("terminal.token_mint", "s-2")),
		store.ErrConflict)
	diff(t, "s-1 records", recordsOf(t, s, "s-1"), []string{"terminal.token_mint"})
	diff(t, "records of a refused mint", recordsOf(t, s, "s-2"), []string(nil))
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
