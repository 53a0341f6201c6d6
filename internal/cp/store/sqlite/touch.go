package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// touchHosts is the Dialect.TouchHosts hook: two statements per batch,
// each over the whole batch passed as one JSON array (json_each), instead
// of a read and a write per host. A heartbeat flush holds every host heard
// in the last interval, so with 19,000 agents the per-host loop took about
// 0.4 s of CPU every 5 s (docs/performance.md, "Reconnect storm: third
// pass"). The first statement revives stale and unknown hosts and returns
// them; the second raises last_seen_at, never lowering it.
func touchHosts(ctx context.Context, db sqlstore.DB, ids []string, ats []int64, now int64) ([]string, error) {
	type seen struct {
		ID string `json:"i"`
		At int64  `json:"a"`
	}
	batch := make([]seen, len(ids))
	for i := range ids {
		batch[i] = seen{ids[i], ats[i]}
	}
	b, err := json.Marshal(batch)
	if err != nil {
		return nil, fmt.Errorf("touch hosts: %w", err)
	}
	const v = `(SELECT json_extract(value, '$.i') AS id, json_extract(value, '$.a') AS at FROM json_each($1)) AS v`
	var revived []string
	err = db.InTx(ctx, func(tx sqlstore.DB) error {
		revived = revived[:0]
		rows, err := tx.Query(ctx, `UPDATE hosts SET status = 'healthy', updated_at = $2 FROM `+v+`
			WHERE hosts.id = v.id AND hosts.status IN ('stale', 'unknown') RETURNING hosts.id`, string(b), now)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			revived = append(revived, id)
		}
		if err := rows.Err(); err != nil {
			rows.Close()
			return err
		}
		rows.Close()
		_, err = tx.Exec(ctx, `UPDATE hosts SET last_seen_at = v.at FROM `+v+`
			WHERE hosts.id = v.id AND v.at > hosts.last_seen_at`, string(b))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("touch hosts: %w", err)
	}
	slices.Sort(revived)
	return revived, nil
}
