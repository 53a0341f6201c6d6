// Package instances owns the instance routes of both listeners: create,
// list, show, stop/start and delete of instances, group scaling, the
// placement check, the node's desired instance set (its long-poll) and
// status reports, and each instance's status history (its events). It places instances (capacity, labels, approved slots,
// settling races between replicas through the Store) and checks the slots
// a slice task names. It must not queue tasks, authenticate callers (the
// server mounts its handlers behind operator or node auth) or keep state
// beyond this replica's placement lock and long-poll waiters: instances are
// in the Store.
package instances

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
)

// Store is what the instances room reads and writes: the instance records,
// and the hosts and approved slots placement reads. store.Store satisfies
// it.
type Store interface {
	store.InstanceStore
	GetHost(ctx context.Context, id string) (store.Host, error)
	ListHosts(ctx context.Context) ([]store.Host, error)
	ListSlots(ctx context.Context, hostID string) ([]store.Slot, error)
}

// Config configures the room.
type Config struct {
	// VCPUAllocationRatio is how many instance vCPUs placement allows per
	// host CPU left after the reservation (0 means 1).
	VCPUAllocationRatio float64
	Log                 *slog.Logger
	Now                 func() time.Time
}

// Room serves the instance routes.
type Room struct {
	store    Store
	audit    *audit.Log
	log      *slog.Logger
	now      func() time.Time
	cpuRatio float64
	// waiters wakes node long-polls on their desired instance set.
	waiters *httpapi.Waiters
	// placeMu serialises this replica's instance placements (check, then
	// insert); across replicas verifyPlacement settles races.
	placeMu sync.Mutex
}

// New is the instances room.
func New(cfg Config, st Store, auditLog *audit.Log) *Room {
	return &Room{store: st, audit: auditLog, log: cfg.Log, now: cfg.Now, cpuRatio: cfg.VCPUAllocationRatio,
		waiters: httpapi.NewWaiters()}
}

// Wake wakes the desired-set long-polls of a node on this replica (an
// instance or host change event, a drain).
func (s *Room) Wake(nodeID string) { s.waiters.Wake(nodeID) }

// WakeAll wakes every desired-set long-poll on this replica: change events
// may have been lost (store.EventResync).
func (s *Room) WakeAll() { s.waiters.WakeAll() }

// errNoChange aborts an UpdateInstance without writing.
var errNoChange = errors.New("no change")
