package storetest

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var miscCases = []testCase{
	{"Token/CreateGetList", testTokens},
	{"Token/Conflict", testTokenConflict},
	{"Token/Roles", testTokenRoles},
	{"Token/Revoke", testTokenRevoke},
	{"Audit/OrderAndFilter", testAudit},
	{"Secret/FirstWriterWins", testSecrets},
	{"Secret/Concurrent", testSecretsConcurrent},
	{"SigningKey/AddListRetire", testSigningKeys},
	{"Subscribe/EndsWithContext", testSubscribeEnds},
	{"Ping", testPing},
}

func token(id, hash string, created time.Duration) store.OperatorToken {
	return store.OperatorToken{ID: id, Name: "name-" + id, Role: api.RoleOperator, TokenHash: hash, CreatedAt: at(created)}
}

func testTokens(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	list, err := s.ListOperatorTokens(ctx)
	must(t, err)
	if len(list) != 0 {
		t.Fatalf("empty store lists %d tokens", len(list))
	}
	b := token("b", "hash-b", 2*time.Second)
	b.ExpiresAt = at(time.Hour)
	a := token("a", "hash-a", 3*time.Second)
	c := token("c", "hash-c", time.Second)
	for _, tok := range []store.OperatorToken{b, a, c} {
		must(t, s.CreateOperatorToken(ctx, tok))
	}
	got, err := s.GetOperatorTokenByHash(ctx, "hash-b")
	must(t, err)
	diff(t, "token", got, b)
	_, err = s.GetOperatorTokenByHash(ctx, "nope")
	wantErr(t, err, store.ErrNotFound)
	list, err = s.ListOperatorTokens(ctx)
	must(t, err)
	diff(t, "tokens oldest first", list, []store.OperatorToken{c, b, a})
}

func testTokenConflict(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	must(t, s.CreateOperatorToken(ctx, token("a", "hash-a", 0)))
	wantErr(t, s.CreateOperatorToken(ctx, token("a", "hash-other", 0)), store.ErrConflict)
	wantErr(t, s.CreateOperatorToken(ctx, token("b", "hash-a", 0)), store.ErrConflict)
	sameName := token("c", "hash-c", 0)
	sameName.Name = "name-a"
	wantErr(t, s.CreateOperatorToken(ctx, sameName), store.ErrConflict)
	list, err := s.ListOperatorTokens(ctx)
	must(t, err)
	diff(t, "tokens after conflicts", list, []store.OperatorToken{token("a", "hash-a", 0)})
}

// testTokenRoles: every role round-trips; a token without a role, or with
// one the schema does not know, is refused.
func testTokenRoles(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for i, r := range api.Roles {
		tok := token(string(r), "hash-"+string(r), time.Duration(i)*time.Second)
		tok.Role = r
		must(t, s.CreateOperatorToken(ctx, tok))
		got, err := s.GetOperatorTokenByHash(ctx, tok.TokenHash)
		must(t, err)
		diff(t, "token with role "+string(r), got, tok)
	}
	for _, bad := range []api.Role{"", "root"} {
		tok := token("bad", "hash-bad", 0)
		tok.Role = bad
		if err := s.CreateOperatorToken(ctx, tok); err == nil {
			t.Fatalf("token with role %q accepted", bad)
		}
	}
}

func testTokenRevoke(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	must(t, s.CreateOperatorToken(ctx, token("a", "hash-a", 0)))
	must(t, s.RevokeOperatorToken(ctx, "a"))
	must(t, s.RevokeOperatorToken(ctx, "a")) // idempotent
	got, err := s.GetOperatorTokenByHash(ctx, "hash-a")
	must(t, err)
	if !got.Revoked {
		t.Fatal("token not revoked")
	}
	wantErr(t, s.RevokeOperatorToken(ctx, "nope"), store.ErrNotFound)
}

func testAudit(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	ev := func(atd time.Duration, action, target, corr string) store.AuditEvent {
		return store.AuditEvent{At: at(atd), Actor: "op", Action: action, Target: target, Result: "ok",
			CorrelationID: corr, Detail: "d-" + action, ActorTokenID: "tok_" + action, ActorRole: api.RoleOperator}
	}
	in := []store.AuditEvent{
		ev(2*time.Second, "b", "host/h1", "c1"),
		ev(1*time.Second, "a", "host/h1", "c1"),
		ev(3*time.Second, "c", "host/h2", "c2"),
		ev(3*time.Second, "d", "host/h2", "c1"), // same At as c, appended later
	}
	in[2].Actor, in[2].ActorRole = "system", ""
	for _, e := range in[:2] {
		e.ID = 12345 // ignored: the store assigns ids
		must(t, s.AppendAudit(ctx, e))
	}
	// The last two in one write: ids in their order ("d" after "c", both
	// at 3 s).
	batch := slices.Clone(in[2:])
	for i := range batch {
		batch[i].ID = 12345
	}
	must(t, s.AppendAudits(ctx, batch))
	must(t, s.AppendAudits(ctx, nil))
	check := func(f store.AuditFilter, want ...string) {
		t.Helper()
		got, err := s.ListAudit(ctx, f)
		must(t, err)
		seen := map[int64]bool{}
		var actions []string
		for _, e := range got {
			if e.ID == 0 || e.ID == 12345 || seen[e.ID] {
				t.Fatalf("bad or duplicate audit id %d", e.ID)
			}
			seen[e.ID] = true
			actions = append(actions, e.Action)
		}
		if actions == nil {
			actions = []string{}
		}
		if want == nil {
			want = []string{}
		}
		diff(t, "audit actions", actions, want)
	}
	check(store.AuditFilter{}, "d", "c", "b", "a")
	check(store.AuditFilter{Target: "host/h1"}, "b", "a")
	check(store.AuditFilter{CorrelationID: "c1"}, "d", "b", "a")
	check(store.AuditFilter{Target: "host/h2", CorrelationID: "c1"}, "d")
	check(store.AuditFilter{Target: "host/none"})
	check(store.AuditFilter{Limit: 2}, "d", "c")
	check(store.AuditFilter{Actor: "system"}, "c")
	check(store.AuditFilter{Actor: "op", Role: api.RoleOperator}, "d", "b", "a")
	check(store.AuditFilter{Role: api.RoleAdmin})
	check(store.AuditFilter{Action: "b"}, "b")
	check(store.AuditFilter{Since: at(2 * time.Second)}, "d", "c", "b")
	check(store.AuditFilter{Until: at(2 * time.Second)}, "a")
	check(store.AuditFilter{Since: at(2 * time.Second), Until: at(3 * time.Second)}, "b")

	got, err := s.ListAudit(ctx, store.AuditFilter{Limit: 1})
	must(t, err)
	want := in[3]
	want.ID = got[0].ID
	diff(t, "audit record", got[0], want)

	// A zero At in a batch is the store's now.
	must(t, s.AppendAudits(ctx, []store.AuditEvent{{Actor: "op", Action: "z"}, {Actor: "op", Action: "z", At: at(time.Second)}}))
	got, err = s.ListAudit(ctx, store.AuditFilter{Action: "z"})
	must(t, err)
	if len(got) != 2 || got[0].At.IsZero() || !got[1].At.Equal(at(time.Second)) {
		t.Fatalf("batch with a zero At: %+v", got)
	}
}

func testSecrets(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	first := []byte{0, 1, 2, 0xff, 'x', 0}
	got, err := s.PutSecretIfAbsent(ctx, "ca-key", first)
	must(t, err)
	if !bytes.Equal(got, first) {
		t.Fatalf("first put returned %x", got)
	}
	got, err = s.PutSecretIfAbsent(ctx, "ca-key", []byte("second"))
	must(t, err)
	if !bytes.Equal(got, first) {
		t.Fatalf("second put returned %x, want the first value %x", got, first)
	}
	got, err = s.PutSecretIfAbsent(ctx, "other", []byte("v"))
	must(t, err)
	if string(got) != "v" {
		t.Fatalf("other secret = %q", got)
	}
}

func testSecretsConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	const workers = 8
	results := make([][]byte, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			v, err := s.PutSecretIfAbsent(ctx, "shared", []byte{byte(i)})
			if err != nil {
				t.Error(err)
			}
			results[i] = v
		})
	}
	wg.Wait()
	for i, r := range results {
		if len(r) != 1 || !bytes.Equal(r, results[0]) {
			t.Fatalf("writer %d got %x, writer 0 got %x: not one winner", i, r, results[0])
		}
	}
}

func testSigningKeys(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	k := func(kid string, created time.Duration) store.SigningKey {
		return store.SigningKey{KID: kid, PrivateKey: []byte("pkcs8-" + kid + "\x00\xff"), CreatedAt: at(created)}
	}
	k1, k2, k3 := k("k1", time.Minute), k("k2", 2*time.Minute), k("k3", 3*time.Minute)
	must(t, s.RotateSigningKey(ctx, k1))
	list, err := s.ListSigningKeys(ctx)
	must(t, err)
	diff(t, "the first key", list, []store.SigningKey{k1})
	must(t, s.RotateSigningKey(ctx, k3, auditRecord("signing_key.rotate", "k3")))
	must(t, s.RotateSigningKey(ctx, k2, auditRecord("signing_key.rotate", "k2"))) // created earlier, rotated in later
	wantErr(t, s.RotateSigningKey(ctx, k("k3", 5*time.Minute), auditRecord("signing_key.rotate", "dup")), store.ErrConflict)
	list, err = s.ListSigningKeys(ctx)
	must(t, err)
	// k1 keeps the time k3 retired it; k3 is retired at k2's creation.
	k1.RetiredAt, k3.RetiredAt = at(3*time.Minute), at(2*time.Minute)
	diff(t, "keys oldest first, one active", list, []store.SigningKey{k1, k2, k3})
	diff(t, "k2 records", recordsOf(t, s, "k2"), []string{"signing_key.rotate"})
	diff(t, "records of a refused rotation", recordsOf(t, s, "dup"), []string(nil))
}

func testSubscribeEnds(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(ctxT(t))
	ch, err := s.Subscribe(ctx)
	must(t, err)
	cancel()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("subscription not closed after its context ended")
		}
	}
}

func testPing(t *testing.T, s store.Store) {
	must(t, s.Ping(ctxT(t)))
}
