package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

const terminalCols = `id, allocation_id, node_id, username, mode, instance_id,
	token_hash, token_expires_at, token_used_at, state, states, error_code, error_message,
	task_id, correlation_id, cols, term_rows, created_by, created_at, closed_at,
	exit_code, exited, close_reason, recording_path, recording_bytes, minted_by_token_id`

// The session's initial readiness state and the terminal modes the schema
// accepts (internal/wire/terminal owns the vocabulary; the store only enforces it).
const (
	terminalStateTokenReady = "token_ready"
	terminalModePTY         = "pty"
	terminalModeSerial      = "serial"
	terminalModeVMSSH       = "vm_ssh"
)

func scanTerminal(r Row) (store.TerminalSession, error) {
	var (
		ts                                store.TerminalSession
		states                            string
		tokenExp, tokenUsed, created, end int64
		cols, rows, exitCode, exited      int64
	)
	if err := r.Scan(&ts.ID, &ts.AllocationID, &ts.NodeID, &ts.Username, &ts.Mode, &ts.InstanceID,
		&ts.TokenHash, &tokenExp, &tokenUsed, &ts.State, &states, &ts.ErrorCode, &ts.ErrorMessage,
		&ts.TaskID, &ts.CorrelationID, &cols, &rows, &ts.CreatedBy, &created, &end,
		&exitCode, &exited, &ts.CloseReason, &ts.RecordingPath, &ts.RecordingBytes, &ts.MintedByTokenID); err != nil {
		return store.TerminalSession{}, err
	}
	ts.States = textRaw(states)
	ts.TokenExpiresAt, ts.TokenUsedAt, ts.CreatedAt, ts.ClosedAt = tm(tokenExp), tm(tokenUsed), tm(created), tm(end)
	ts.Cols, ts.Rows, ts.ExitCode, ts.Exited = int(cols), int(rows), int(exitCode), exited != 0
	return ts, nil
}

// terminalArgs returns ts's column values in terminalCols order.
func terminalArgs(ts store.TerminalSession) []any {
	return []any{ts.ID, ts.AllocationID, ts.NodeID, ts.Username, ts.Mode, ts.InstanceID,
		ts.TokenHash, ms(ts.TokenExpiresAt), ms(ts.TokenUsedAt), ts.State, rawText(ts.States), ts.ErrorCode, ts.ErrorMessage,
		ts.TaskID, ts.CorrelationID, int64(ts.Cols), int64(ts.Rows), ts.CreatedBy, ms(ts.CreatedAt), ms(ts.ClosedAt),
		int64(ts.ExitCode), boolInt(ts.Exited), ts.CloseReason, ts.RecordingPath, ts.RecordingBytes, ts.MintedByTokenID}
}

// CreateTerminalSession implements store.Store. The id, allocation id and
// token hash are required; Mode must be "pty", "serial" or "vm_ssh". Defaults: State
// token_ready, CreatedAt now.
func (s *Store) CreateTerminalSession(ctx context.Context, ts store.TerminalSession, audit ...store.AuditEvent) error {
	switch {
	case ts.ID == "":
		return errors.New("create terminal session: empty id")
	case ts.AllocationID == "":
		return fmt.Errorf("create terminal session %q: empty allocation id", ts.ID)
	case ts.TokenHash == "":
		return fmt.Errorf("create terminal session %q: empty token hash", ts.ID)
	case ts.Mode != terminalModePTY && ts.Mode != terminalModeSerial && ts.Mode != terminalModeVMSSH:
		return fmt.Errorf("create terminal session %q: mode %q is not pty, serial or vm_ssh", ts.ID, ts.Mode)
	}
	if ts.State == "" {
		ts.State = terminalStateTokenReady
	}
	if ts.CreatedAt.IsZero() {
		ts.CreatedAt = s.now()
	}
	err := s.withRecords(ctx, audit, func(db DB) error {
		_, err := db.Exec(ctx, `INSERT INTO terminal_sessions (`+terminalCols+`) VALUES
		($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
		$21, $22, $23, $24, $25, $26)`, terminalArgs(ts)...)
		return err
	})
	if err != nil {
		if s.conflict(err) {
			// The hash is a credential: keep it out of the error.
			return fmt.Errorf("create terminal session %q (id or token hash taken): %w", ts.ID, store.ErrConflict)
		}
		return fmt.Errorf("create terminal session %q: %w", ts.ID, err)
	}
	return nil
}

// GetTerminalSession implements store.Store.
func (s *Store) GetTerminalSession(ctx context.Context, id string) (store.TerminalSession, error) {
	ts, err := scanTerminal(s.db.QueryRow(ctx, `SELECT `+terminalCols+` FROM terminal_sessions WHERE id = $1`, id))
	if err != nil {
		return store.TerminalSession{}, notFound(err, "get terminal session %q", id)
	}
	return ts, nil
}

// RedeemTerminalToken implements store.Store with one conditional UPDATE
// (token_used_at = 0 in its WHERE): PostgreSQL re-checks the condition after
// a concurrent redeemer commits and SQLite serialises writers, so exactly one
// caller burns a token. The loser tells not-found from already-redeemed by
// reading the row afterwards; sessions are never deleted, so that read
// cannot misreport a redeemed token as unknown. A zero now is the store's
// clock.
func (s *Store) RedeemTerminalToken(ctx context.Context, tokenHash string, now time.Time) (store.TerminalSession, error) {
	if now.IsZero() {
		now = s.now()
	}
	used := ms(now)
	if used == 0 {
		// 0 means "not redeemed": a burned token must read as burned.
		used = 1
	}
	ts, err := scanTerminal(s.db.QueryRow(ctx, `UPDATE terminal_sessions SET token_used_at = $2
		WHERE token_hash = $1 AND token_used_at = 0 RETURNING `+terminalCols, tokenHash, used))
	if err == nil {
		return ts, nil
	}
	if !errors.Is(err, ErrNoRows) {
		// The hash is a credential: keep it out of the errors.
		return store.TerminalSession{}, fmt.Errorf("redeem terminal token: %w", err)
	}
	var id string
	err = s.db.QueryRow(ctx, `SELECT id FROM terminal_sessions WHERE token_hash = $1`, tokenHash).Scan(&id)
	if err != nil {
		return store.TerminalSession{}, notFound(err, "redeem terminal token")
	}
	return store.TerminalSession{}, fmt.Errorf("redeem terminal token of session %q: already redeemed: %w", id, store.ErrConflict)
}

// UpdateTerminalSession implements store.Store. fn runs while the row is
// locked and must not call the store. It cannot change the id, CreatedAt or
// TokenHash, and a redeemed token stays redeemed: fn may burn an unused
// token by setting TokenUsedAt but cannot clear or move it once set.
func (s *Store) UpdateTerminalSession(ctx context.Context, id string, fn func(*store.TerminalSession) error) (store.TerminalSession, error) {
	var out store.TerminalSession
	err := s.db.InTx(ctx, func(tx DB) error {
		ts, err := scanTerminal(tx.QueryRow(ctx, `SELECT `+terminalCols+` FROM terminal_sessions WHERE id = $1`+s.d.ForUpdate, id))
		if err != nil {
			return notFound(err, "update terminal session %q", id)
		}
		created, hash, usedAt := ts.CreatedAt, ts.TokenHash, ts.TokenUsedAt
		if err := fn(&ts); err != nil {
			return err
		}
		ts.ID, ts.CreatedAt, ts.TokenHash = id, created, hash
		if !usedAt.IsZero() {
			ts.TokenUsedAt = usedAt
		}
		if _, err := tx.Exec(ctx, `UPDATE terminal_sessions SET allocation_id = $2, node_id = $3, username = $4,
			mode = $5, instance_id = $6, token_hash = $7, token_expires_at = $8, token_used_at = $9, state = $10,
			states = $11, error_code = $12, error_message = $13, task_id = $14, correlation_id = $15, cols = $16,
			term_rows = $17, created_by = $18, created_at = $19, closed_at = $20, exit_code = $21, exited = $22,
			close_reason = $23, recording_path = $24, recording_bytes = $25, minted_by_token_id = $26
			WHERE id = $1`, terminalArgs(ts)...); err != nil {
			return fmt.Errorf("update terminal session %q: %w", id, err)
		}
		// Read back so the caller sees exactly what a later
		// GetTerminalSession returns (millisecond UTC times, empty JSON as nil).
		out, err = scanTerminal(tx.QueryRow(ctx, `SELECT `+terminalCols+` FROM terminal_sessions WHERE id = $1`, id))
		if err != nil {
			return fmt.Errorf("update terminal session %q: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return store.TerminalSession{}, err
	}
	return out, nil
}

// ListTerminalSessions implements store.Store: newest first (created_at,
// then id, descending), at most f.Limit (default 100).
func (s *Store) ListTerminalSessions(ctx context.Context, f store.TerminalSessionFilter) ([]store.TerminalSession, error) {
	var (
		where []string
		args  []any
	)
	if f.AllocationID != "" {
		args = append(args, f.AllocationID)
		where = append(where, "allocation_id = $"+strconv.Itoa(len(args)))
	}
	if f.NodeID != "" {
		args = append(args, f.NodeID)
		where = append(where, "node_id = $"+strconv.Itoa(len(args)))
	}
	if f.CorrelationID != "" {
		args = append(args, f.CorrelationID)
		where = append(where, "correlation_id = $"+strconv.Itoa(len(args)))
	}
	if f.TaskID != "" {
		args = append(args, f.TaskID)
		where = append(where, "task_id = $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + terminalCols + ` FROM terminal_sessions`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit(f.Limit))
	q += ` ORDER BY created_at DESC, id DESC LIMIT $` + strconv.Itoa(len(args))
	out, err := collect(scanTerminal)(s.db.Query(ctx, q, args...))
	if err != nil {
		return nil, fmt.Errorf("list terminal sessions: %w", err)
	}
	return out, nil
}
