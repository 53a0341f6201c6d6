// Package secrets owns workload secrets: the operator routes that set,
// list, show and delete them (values go in, never out: every answer, audit
// record and log line carries names, versions and timestamps only) and the
// node route through which an agent fetches, over mTLS, the values of the
// secrets an instance placed on it names in its spec. Values are sealed
// with the key-encryption key (cp/keys) before they reach the Store and
// opened only to answer that node route. It must not authenticate callers
// (the server mounts its handlers behind operator or node auth) or keep
// any value beyond one request.
package secrets

import (
	"context"
	"log/slog"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Store is what the room reads and writes: the workload secrets, and the
// instance records the node route checks a fetch against. store.Store
// satisfies it.
type Store interface {
	store.WorkloadSecretStore
	GetInstance(ctx context.Context, id string) (store.Instance, error)
}

// Sealer seals and opens values with the key-encryption key, bound to the
// secret's name; *keys.Keys is one.
type Sealer interface {
	SealWorkloadSecret(name string, plain []byte) ([]byte, error)
	OpenWorkloadSecret(name string, sealed []byte) ([]byte, error)
}

// Room serves the secret routes.
type Room struct {
	store Store
	seal  Sealer
	audit *audit.Log
	log   *slog.Logger
	now   func() time.Time
}

// New is the secrets room.
func New(st Store, sealer Sealer, auditLog *audit.Log, log *slog.Logger, now func() time.Time) *Room {
	return &Room{store: st, seal: sealer, audit: auditLog, log: log, now: now}
}

// view is a secret's metadata: never its value.
func view(ws store.WorkloadSecret) api.Secret {
	return api.Secret{Name: ws.Name, Version: ws.Version, CreatedBy: ws.CreatedBy, CreatedAt: ws.CreatedAt,
		UpdatedBy: ws.UpdatedBy, UpdatedAt: ws.UpdatedAt}
}
