-- The host's last failure (an internal/wire/signal name, its detail, the
-- correlation id and when), its environment profile (the node API and
-- terminal URLs it should use, and those its agent reports) and the last
-- successful preflight; and the stored preflight runs (internal/wire/preflight
-- reports). Same portable conventions as 00001.

-- +goose Up
ALTER TABLE hosts ADD COLUMN last_failure_signal TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN last_failure_detail TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN last_failure_correlation_id TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN last_failure_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN last_successful_preflight_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN profile_api_url TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN profile_terminal_url TEXT NOT NULL DEFAULT '';

CREATE TABLE preflight_runs (
    id             TEXT    NOT NULL PRIMARY KEY,
    host_id        TEXT    NOT NULL DEFAULT '',
    correlation_id TEXT    NOT NULL DEFAULT '',
    ok             INTEGER NOT NULL DEFAULT 0 CHECK (ok IN (0, 1)),
    failed_hop     TEXT    NOT NULL DEFAULT '',
    signal         TEXT    NOT NULL DEFAULT '',
    report         TEXT    NOT NULL DEFAULT '',
    created_by     TEXT    NOT NULL DEFAULT '',
    created_at     BIGINT  NOT NULL DEFAULT 0
);

CREATE INDEX preflight_runs_host_created ON preflight_runs (host_id, created_at);
CREATE INDEX preflight_runs_correlation ON preflight_runs (correlation_id);

-- +goose Down
DROP TABLE preflight_runs;
ALTER TABLE hosts DROP COLUMN profile_terminal_url;
ALTER TABLE hosts DROP COLUMN profile_api_url;
ALTER TABLE hosts DROP COLUMN last_successful_preflight_at;
ALTER TABLE hosts DROP COLUMN last_failure_at;
ALTER TABLE hosts DROP COLUMN last_failure_correlation_id;
ALTER TABLE hosts DROP COLUMN last_failure_detail;
ALTER TABLE hosts DROP COLUMN last_failure_signal;
