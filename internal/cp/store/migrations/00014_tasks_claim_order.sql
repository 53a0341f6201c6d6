-- The claim reads a node's oldest queued task: ORDER BY created_at, id
-- LIMIT 1 over node_id = ? AND state = 'queued'. With id in the index as
-- well, the claim reads the first index entry in that order instead of
-- every queued task of the node followed by a sort (PostgreSQL sorted them
-- all on every claim; the PostgreSQL claim batch does one such pick per
-- node). Same name, so SQLite's INDEXED BY (sqlite.go) still names it.

-- +goose Up
DROP INDEX tasks_node_state_created;
CREATE INDEX tasks_node_state_created ON tasks (node_id, state, created_at, id);

-- +goose Down
DROP INDEX tasks_node_state_created;
CREATE INDEX tasks_node_state_created ON tasks (node_id, state, created_at);
