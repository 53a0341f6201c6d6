package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/store"
)

// ResealStore is what ResealSessions reads and writes: every session and
// their sealed tokens (store.Store has it).
type ResealStore interface {
	ListDashboardSessions(ctx context.Context) ([]store.DashboardSession, error)
	ReplaceDashboardSessionToken(ctx context.Context, idHash string, old, token []byte) error
	DeleteDashboardSession(ctx context.Context, idHash string) error
}

// ResealSessions seals again with ring's primary KEK the operator token of
// every dashboard session sealed with a previous KEK of the ring (a KEK
// rotation), as keys.SealWorkloadSecrets does for the workload secrets, so
// that the retired KEK opens none of them: those tokens are operator
// bearer tokens. A session whose token no KEK of the ring opens can never
// be used again and is deleted (its browser logs in again). A token
// changed meanwhile (a logout, a new login) is left to that writer. It
// returns how many sessions it sealed again; the control plane runs it on
// every start with a KEK (server.SealAtRest), `drover keys rotate-kek`
// offline.
func ResealSessions(ctx context.Context, st ResealStore, ring *kek.Ring, log *slog.Logger) (int, error) {
	list, err := st.ListDashboardSessions(ctx)
	if err != nil {
		return 0, fmt.Errorf("reseal dashboard sessions: %w", err)
	}
	n := 0
	for _, ds := range list {
		if id, _ := kek.KeyID(ds.Token); id == ring.PrimaryID() {
			continue
		}
		name := sealName(ds.IDHash)
		plain, err := ring.Open(name, ds.Token)
		if err != nil {
			if err := st.DeleteDashboardSession(ctx, ds.IDHash); err != nil {
				return n, fmt.Errorf("reseal dashboard sessions: delete one that does not open: %w", err)
			}
			log.Info("dashboard session whose token no key-encryption key opens deleted; its browser logs in again",
				"token_id", ds.TokenID, "err", err)
			continue
		}
		sealed, err := ring.Seal(name, plain)
		clear(plain)
		if err != nil {
			return n, fmt.Errorf("reseal dashboard sessions: %w", err)
		}
		switch err := st.ReplaceDashboardSessionToken(ctx, ds.IDHash, ds.Token, sealed); {
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			continue // ended or replaced meanwhile
		case err != nil:
			return n, fmt.Errorf("reseal dashboard sessions: %w", err)
		}
		n++
	}
	if n > 0 {
		log.Info("dashboard sessions sealed with the new key-encryption key", "sessions", n, "kek_id", ring.PrimaryID())
	}
	return n, nil
}
