-- Each dashboard session names the operator token it acts with (its id,
-- never the token), so that one token keeps a bounded number of sessions:
-- a login beyond the bound ends that token's oldest session, and a token
-- cannot fill the table with logins.

-- +goose Up
ALTER TABLE dashboard_sessions ADD COLUMN token_id TEXT NOT NULL DEFAULT '';
CREATE INDEX dashboard_sessions_token ON dashboard_sessions (token_id, created_at);

-- +goose Down
DROP INDEX dashboard_sessions_token;
ALTER TABLE dashboard_sessions DROP COLUMN token_id;
