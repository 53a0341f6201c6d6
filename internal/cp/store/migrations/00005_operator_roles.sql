-- Operator token roles (viewer < operator < admin), unique token names, and
-- the acting token's id and role on audit records. Same portable conventions
-- as 00001.
--
-- Tokens that exist before this migration could do everything, so they
-- become admin: nothing that worked stops working. Duplicate names are made
-- unique by keeping the oldest token's name (created_at, then id) and
-- suffixing every later one with "-<token id>"; ids are unique, so the
-- suffixed names are too. The role column's DEFAULT only fills existing
-- rows: the store always writes the role. Down keeps the suffixed names.

-- +goose Up
ALTER TABLE operator_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'admin'
    CHECK (role IN ('viewer', 'operator', 'admin'));

UPDATE operator_tokens SET name = name || '-' || id
WHERE EXISTS (
    SELECT 1 FROM operator_tokens older
    WHERE older.name = operator_tokens.name
      AND (older.created_at < operator_tokens.created_at
           OR (older.created_at = operator_tokens.created_at AND older.id < operator_tokens.id))
);

CREATE UNIQUE INDEX operator_tokens_name ON operator_tokens (name);

ALTER TABLE audit ADD COLUMN actor_token_id TEXT NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN actor_role TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE audit DROP COLUMN actor_role;
ALTER TABLE audit DROP COLUMN actor_token_id;
DROP INDEX operator_tokens_name;
ALTER TABLE operator_tokens DROP COLUMN role;
