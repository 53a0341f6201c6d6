package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// touchHosts' statements, $1 the batch as a JSON array of {"i": id, "a":
// unix ms}. The revive names the batch in an uncorrelated IN subquery,
// which SQLite evaluates once into a temporary index.
const (
	reviveHosts = `UPDATE hosts SET status = 'healthy', updated_at = $2
		WHERE id IN (SELECT json_extract(value, '$.i') FROM json_each($1)) AND status IN ('stale', 'unknown')
		RETURNING id`
	raiseLastSeen = `UPDATE hosts SET last_seen_at = v.at
		FROM (SELECT json_extract(value, '$.i') AS id, json_extract(value, '$.a') AS at FROM json_each($1)) AS v
		WHERE hosts.id = v.id AND v.at > hosts.last_seen_at`
)

// touchHosts is the Dialect.TouchHosts hook: two statements per batch,
// each over the whole batch passed as one JSON array (json_each), instead
// of a read and a write per host. A heartbeat flush holds every host heard
// in the last interval, so with 19,000 agents the per-host loop took about
// 0.4 s of CPU every 5 s (docs/performance.md, "Reconnect storm: third
// pass"). The first statement revives stale and unknown hosts and returns
// them; the second raises last_seen_at, never lowering it.
//
// Each statement reads the batch once (TestTouchHostsReadsBatchOnce). A
// first version of the revive was a join as the second is, which SQLite ran
// with the stale hosts outside and json_each inside: the whole batch parsed
// again for each stale host. After a restart whose agents were not all
// back within three intervals (thousands stale, 19,000 in the batch), each
// flush held the writer for seconds, half the server's CPU in a reconnect
// storm, and the storm took 40 s instead of 14.
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
	var revived []string
	err = db.InTx(ctx, func(tx sqlstore.DB) error {
		revived = revived[:0]
		rows, err := tx.Query(ctx, reviveHosts, string(b), now)
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
		_, err = tx.Exec(ctx, raiseLastSeen, string(b))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("touch hosts: %w", err)
	}
	slices.Sort(revived)
	return revived, nil
}
