package sqlstore

import (
	"context"
	"fmt"
	"time"
)

// ClaimHealthProbe implements store.Store: one conditional update, so of
// replicas racing for the same slot exactly one sees a row changed.
func (s *Store) ClaimHealthProbe(ctx context.Context, id string, slot time.Time) (bool, error) {
	n, err := s.db.Exec(ctx, `UPDATE hosts SET health_probe_at = $2 WHERE id = $1 AND health_probe_at < $2`, id, ms(slot))
	if err != nil {
		return false, fmt.Errorf("claim health probe %q: %w", id, err)
	}
	return n == 1, nil
}
