-- The operator token that minted a terminal session's token, so that
-- revoking the token ends the session on whichever replica holds it. Empty
-- for sessions minted before this migration. Same portable conventions as
-- 00001.

-- +goose Up
ALTER TABLE terminal_sessions ADD COLUMN minted_by_token_id TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE terminal_sessions DROP COLUMN minted_by_token_id;
