package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// CreateOperatorToken implements store.Store. A zero CreatedAt is now.
func (s *Store) CreateOperatorToken(ctx context.Context, t store.OperatorToken, audit ...store.AuditEvent) error {
	if t.ID == "" || t.TokenHash == "" || t.Role == "" {
		return errors.New("create operator token: empty id, hash or role")
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = s.now()
	}
	return s.db.InTx(ctx, func(tx DB) error {
		_, err := tx.Exec(ctx, `INSERT INTO operator_tokens (id, name, role, token_hash, created_at, expires_at, revoked)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			t.ID, t.Name, string(t.Role), t.TokenHash, ms(t.CreatedAt), ms(t.ExpiresAt), boolInt(t.Revoked))
		if err != nil {
			if s.d.IsUniqueViolation(err) {
				return fmt.Errorf("create operator token %q: %w", t.ID, store.ErrConflict)
			}
			return fmt.Errorf("create operator token %q: %w", t.ID, err)
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("create operator token %q: audit: %w", t.ID, err)
		}
		return nil
	})
}

const tokenCols = `id, name, role, token_hash, created_at, expires_at, revoked`

func scanToken(r Row) (store.OperatorToken, error) {
	var (
		t                         store.OperatorToken
		role                      string
		created, expires, revoked int64
	)
	if err := r.Scan(&t.ID, &t.Name, &role, &t.TokenHash, &created, &expires, &revoked); err != nil {
		return store.OperatorToken{}, err
	}
	t.Role, t.CreatedAt, t.ExpiresAt, t.Revoked = api.Role(role), tm(created), tm(expires), revoked != 0
	return t, nil
}

// GetOperatorTokenByHash implements store.Store. It returns revoked and
// expired tokens too; the caller decides.
func (s *Store) GetOperatorTokenByHash(ctx context.Context, hash string) (store.OperatorToken, error) {
	t, err := scanToken(s.db.QueryRow(ctx, `SELECT `+tokenCols+` FROM operator_tokens WHERE token_hash = $1`, hash))
	if err != nil {
		// The hash is a credential: keep it out of the error.
		return store.OperatorToken{}, notFound(err, "get operator token by hash")
	}
	return t, nil
}

// ListOperatorTokens implements store.Store.
func (s *Store) ListOperatorTokens(ctx context.Context) ([]store.OperatorToken, error) {
	out, err := collect(scanToken)(s.db.Query(ctx, `SELECT `+tokenCols+` FROM operator_tokens ORDER BY created_at, id`))
	if err != nil {
		return nil, fmt.Errorf("list operator tokens: %w", err)
	}
	return out, nil
}

// GetOperatorToken implements store.Store.
func (s *Store) GetOperatorToken(ctx context.Context, id string) (store.OperatorToken, error) {
	t, err := scanToken(s.db.QueryRow(ctx, `SELECT `+tokenCols+` FROM operator_tokens WHERE id = $1`, id))
	if err != nil {
		return store.OperatorToken{}, notFound(err, "get operator token %q", id)
	}
	return t, nil
}

// RevokeOperatorToken implements store.Store; revoking twice is not an
// error (and publishes the event again).
func (s *Store) RevokeOperatorToken(ctx context.Context, id string, audit ...store.AuditEvent) error {
	return s.db.InTx(ctx, func(tx DB) error {
		n, err := tx.Exec(ctx, `UPDATE operator_tokens SET revoked = 1 WHERE id = $1`, id)
		if err != nil {
			return fmt.Errorf("revoke operator token %q: %w", id, err)
		}
		if n == 0 {
			return fmt.Errorf("revoke operator token %q: %w", id, store.ErrNotFound)
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("revoke operator token %q: audit: %w", id, err)
		}
		if err := s.d.Notify(ctx, tx, store.Event{Kind: store.EventOperatorToken, ID: id}); err != nil {
			return fmt.Errorf("revoke operator token %q: notify: %w", id, err)
		}
		return nil
	})
}

// AppendAudit implements store.Store. The record's ID is assigned here (see
// nextAuditID); e.ID is ignored. A zero At is now.
func (s *Store) AppendAudit(ctx context.Context, e store.AuditEvent) error {
	return s.AppendAudits(ctx, []store.AuditEvent{e})
}

// auditCols is the number of columns AppendAudits writes per record, and
// auditInsert its statement for one record (every single AppendAudit).
const (
	auditCols   = 10
	auditInsert = `INSERT INTO audit (id, at, actor, actor_token_id, actor_role, action, target, result, correlation_id, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`
)

// auditInsertRows is the statement for n records (auditInsert for one).
func auditInsertRows(n int) string {
	if n == 1 {
		return auditInsert
	}
	q := []byte(auditInsert[:strings.Index(auditInsert, "VALUES ")+len("VALUES ")])
	for i := range n {
		if i > 0 {
			q = append(q, ", "...)
		}
		q = append(q, '(')
		for c := range auditCols {
			if c > 0 {
				q = append(q, ", "...)
			}
			q = append(q, '$')
			q = strconv.AppendInt(q, int64(i*auditCols+c+1), 10)
		}
		q = append(q, ')')
	}
	return string(q)
}

// AppendAudits implements store.Store: the records in one statement, their
// ids increasing in es's order. A zero At is now; each ID is ignored.
func (s *Store) AppendAudits(ctx context.Context, es []store.AuditEvent) error {
	if len(es) == 0 {
		return nil
	}
	q := auditInsertRows(len(es))
	var err error
	for range 5 { // ids from another replica's clock may collide: new ones
		_, err = s.db.Exec(ctx, q, s.auditArgs(es, nil)...)
		if err == nil || !s.d.IsUniqueViolation(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("append audit: %w", err)
	}
	return nil
}

// auditArgs is the insert's arguments for es, each under a new id (also
// put in ids, when not nil). A zero At is now.
func (s *Store) auditArgs(es []store.AuditEvent, ids []int64) []any {
	now := s.now()
	args := make([]any, 0, auditCols*len(es))
	for i, e := range es {
		if e.At.IsZero() {
			e.At = now
		}
		id := nextAuditID()
		if ids != nil {
			ids[i] = id
		}
		args = append(args, id, ms(e.At), e.Actor, e.ActorTokenID, string(e.ActorRole), e.Action,
			e.Target, e.Result, e.CorrelationID, e.Detail)
	}
	return args
}

// AuditColumns is es as the audit table's columns, in auditInsert's
// order, one slice each (ids []int64, at []int64, the rest []string), each
// record under a new id; a zero At is now. The PostgreSQL group commit
// writes them with one unnest statement whose text does not depend on
// the number of records.
func (s *Store) AuditColumns(es []store.AuditEvent) []any {
	now := s.now()
	n := len(es)
	ids, ats := make([]int64, n), make([]int64, n)
	texts := make([][]string, auditCols-2)
	for c := range texts {
		texts[c] = make([]string, n)
	}
	for i, e := range es {
		if e.At.IsZero() {
			e.At = now
		}
		ids[i], ats[i] = nextAuditID(), ms(e.At)
		for c, v := range [...]string{e.Actor, e.ActorTokenID, string(e.ActorRole), e.Action, e.Target, e.Result, e.CorrelationID, e.Detail} {
			texts[c][i] = v
		}
	}
	cols := []any{ids, ats}
	for _, t := range texts {
		cols = append(cols, t)
	}
	return cols
}

// maxAuditRows bounds the records of one insert: a whole fleet can go
// stale in one sweep, and PostgreSQL takes at most 65,535 parameters in a
// statement (SQLite 32,766).
const maxAuditRows = 500

// errRecords marks a failure to write a change's records (withRecords),
// so that its cause is never taken for the change's own conflict.
var errRecords = errors.New("audit records not written")

// withRecords runs write on the store or, with records, in a transaction
// that then appends them: a created row is never seen without its
// records. write's error is returned as it is (a unique violation stays
// one); a record's is wrapped in errRecords.
func (s *Store) withRecords(ctx context.Context, records []store.AuditEvent, write func(DB) error) error {
	if len(records) == 0 {
		return write(s.db)
	}
	return s.db.InTx(ctx, func(tx DB) error {
		if err := write(tx); err != nil {
			return err
		}
		if err := s.appendAuditsTx(ctx, tx, records); err != nil {
			return fmt.Errorf("%w: %w", errRecords, err)
		}
		return nil
	})
}

// conflict says whether err, from withRecords, is the write's own unique
// violation (not a record's).
func (s *Store) conflict(err error) bool {
	return s.d.IsUniqueViolation(err) && !errors.Is(err, errRecords)
}

// appendAuditsTx inserts es in tx, the transaction of the change they
// describe, maxAuditRows at a time.
func (s *Store) appendAuditsTx(ctx context.Context, tx DB, es []store.AuditEvent) error {
	for chunk := range slices.Chunk(es, maxAuditRows) {
		if err := s.insertAuditsTx(ctx, tx, chunk); err != nil {
			return err
		}
	}
	return nil
}

// insertAuditsTx inserts es in one statement. A refused statement would
// end a PostgreSQL transaction, so an id another replica's clock already
// gave a record is skipped by the insert instead, and the records it
// skipped are inserted again under new ids.
func (s *Store) insertAuditsTx(ctx context.Context, tx DB, es []store.AuditEvent) error {
	if s.d.StatementRollback { // AppendAudits' plain INSERT: no rows to read back
		var err error
		for range 5 {
			_, err = tx.Exec(ctx, auditInsertRows(len(es)), s.auditArgs(es, nil)...)
			if err == nil || !s.d.IsUniqueViolation(err) {
				return err
			}
		}
		return fmt.Errorf("records kept colliding with existing ids: %w", err)
	}
	for range 5 {
		ids := make([]int64, len(es))
		inserted, err := collectInts(tx.Query(ctx, auditInsertRows(len(es))+` ON CONFLICT (id) DO NOTHING RETURNING id`,
			s.auditArgs(es, ids)...))
		if err != nil {
			return err
		}
		if len(inserted) == len(es) {
			return nil
		}
		var skipped []store.AuditEvent
		for i, e := range es {
			if !slices.Contains(inserted, ids[i]) {
				skipped = append(skipped, e)
			}
		}
		es = skipped
	}
	return fmt.Errorf("%d record(s) kept colliding with existing ids", len(es))
}

// ListAudit implements store.Store: newest At first, ties by id descending
// (the order they were appended in one process).
func (s *Store) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditEvent, error) {
	var (
		where []string
		args  []any
	)
	for _, c := range []struct{ col, v string }{{"actor", f.Actor}, {"actor_role", string(f.Role)},
		{"action", f.Action}, {"target", f.Target}, {"correlation_id", f.CorrelationID}} {
		if c.v != "" {
			args = append(args, c.v)
			where = append(where, c.col+" = $"+strconv.Itoa(len(args)))
		}
	}
	if !f.Since.IsZero() {
		args = append(args, ms(f.Since))
		where = append(where, "at >= $"+strconv.Itoa(len(args)))
	}
	if !f.Until.IsZero() {
		args = append(args, ms(f.Until))
		where = append(where, "at < $"+strconv.Itoa(len(args)))
	}
	q := `SELECT id, at, actor, actor_token_id, actor_role, action, target, result, correlation_id, detail FROM audit`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit(f.Limit))
	q += ` ORDER BY at DESC, id DESC LIMIT $` + strconv.Itoa(len(args))
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	var out []store.AuditEvent
	for rows.Next() {
		var (
			e        store.AuditEvent
			at       int64
			roleText string
		)
		if err := rows.Scan(&e.ID, &at, &e.Actor, &e.ActorTokenID, &roleText, &e.Action, &e.Target, &e.Result,
			&e.CorrelationID, &e.Detail); err != nil {
			return nil, fmt.Errorf("list audit: %w", err)
		}
		e.At, e.ActorRole = tm(at), api.Role(roleText)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return out, nil
}

// PutSecretIfAbsent implements store.Store with INSERT ... ON CONFLICT DO
// NOTHING followed by a read, so concurrent replicas all get the first
// committed value.
func (s *Store) PutSecretIfAbsent(ctx context.Context, name string, value []byte) ([]byte, error) {
	if _, err := s.db.Exec(ctx, `INSERT INTO secrets (name, value, created_at) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO NOTHING`, name, b64(value), ms(s.now())); err != nil {
		return nil, fmt.Errorf("put secret %q: %w", name, err)
	}
	var v string
	if err := s.db.QueryRow(ctx, `SELECT value FROM secrets WHERE name = $1`, name).Scan(&v); err != nil {
		return nil, fmt.Errorf("put secret %q: read back: %w", name, err)
	}
	b, err := unb64(v)
	if err != nil {
		return nil, fmt.Errorf("put secret %q: %w", name, err)
	}
	return b, nil
}

// RotateSigningKey implements store.Store. A zero CreatedAt is now.
func (s *Store) RotateSigningKey(ctx context.Context, k store.SigningKey, audit ...store.AuditEvent) error {
	if k.KID == "" {
		return errors.New("rotate signing key: empty kid")
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = s.now()
	}
	return s.db.InTx(ctx, func(tx DB) error {
		_, err := tx.Exec(ctx, `INSERT INTO signing_keys (kid, private_key, created_at, retired_at) VALUES ($1, $2, $3, $4)`,
			k.KID, b64(k.PrivateKey), ms(k.CreatedAt), ms(k.RetiredAt))
		if err != nil {
			if s.d.IsUniqueViolation(err) {
				return fmt.Errorf("rotate signing key %q: %w", k.KID, store.ErrConflict)
			}
			return fmt.Errorf("rotate signing key %q: %w", k.KID, err)
		}
		// Keys already retired keep their RetiredAt.
		if _, err := tx.Exec(ctx, `UPDATE signing_keys SET retired_at = $2 WHERE retired_at = 0 AND kid <> $1`,
			k.KID, ms(k.CreatedAt)); err != nil {
			return fmt.Errorf("rotate signing key %q: retire the others: %w", k.KID, err)
		}
		if err := s.appendAuditsTx(ctx, tx, audit); err != nil {
			return fmt.Errorf("rotate signing key %q: audit: %w", k.KID, err)
		}
		return nil
	})
}

// ListSigningKeys implements store.Store.
func (s *Store) ListSigningKeys(ctx context.Context) ([]store.SigningKey, error) {
	rows, err := s.db.Query(ctx, `SELECT kid, private_key, created_at, retired_at FROM signing_keys ORDER BY created_at, kid`)
	if err != nil {
		return nil, fmt.Errorf("list signing keys: %w", err)
	}
	defer rows.Close()
	var out []store.SigningKey
	for rows.Next() {
		var (
			k                key
			created, retired int64
		)
		if err := rows.Scan(&k.kid, &k.priv, &created, &retired); err != nil {
			return nil, fmt.Errorf("list signing keys: %w", err)
		}
		priv, err := unb64(k.priv)
		if err != nil {
			return nil, fmt.Errorf("list signing keys: key %q: %w", k.kid, err)
		}
		out = append(out, store.SigningKey{KID: k.kid, PrivateKey: priv, CreatedAt: tm(created), RetiredAt: tm(retired)})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list signing keys: %w", err)
	}
	return out, nil
}

type key struct{ kid, priv string }
