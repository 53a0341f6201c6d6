-- The host cache refreshes by reading only the hosts changed since its
-- last read (updated_at >= ?), and the whole fleet only now and then:
-- without an index each refresh read every row, capabilities included,
-- to find the few that changed.

-- +goose Up
CREATE INDEX hosts_updated_at ON hosts (updated_at);

-- +goose Down
DROP INDEX hosts_updated_at;
