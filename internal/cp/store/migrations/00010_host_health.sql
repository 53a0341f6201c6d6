-- The host's last health: what the last finished diag.health_probe said
-- (health is healthy, unhealthy or unknown; '' before any probe), its
-- summary, when and which task; and health_probe_at, the start of the
-- scheduling slot a control plane replica last claimed to probe the host
-- (internal/cp/healthsched): a conditional update on it lets exactly one
-- replica schedule a host per interval. Same portable conventions as 00001.

-- +goose Up
ALTER TABLE hosts ADD COLUMN health TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN health_summary TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN health_checked_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN health_task_id TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN health_probe_at BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE hosts DROP COLUMN health_probe_at;
ALTER TABLE hosts DROP COLUMN health_task_id;
ALTER TABLE hosts DROP COLUMN health_checked_at;
ALTER TABLE hosts DROP COLUMN health_summary;
ALTER TABLE hosts DROP COLUMN health;
