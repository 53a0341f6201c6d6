package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/drover-dev/drover/internal/cp/store"
)

// listenStats is what a store with a change-notification connection of its
// own reports (postgres.Store).
type listenStats interface {
	ListenStats() (listening bool, reconnects uint64)
}

// registerStoreMetrics exports the store's LISTEN connection state where
// it has one: drover_store_listen_up (1 while listening) and
// drover_store_listen_reconnects_total.
func registerStoreMetrics(reg prometheus.Registerer, st store.Store) {
	ls, ok := st.(listenStats)
	if !ok {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_store_listen_up",
			Help: "1 while this replica's PostgreSQL LISTEN connection (cross-replica change events) is up."},
			func() float64 {
				if up, _ := ls.ListenStats(); up {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "drover_store_listen_reconnects_total",
			Help: "Times the PostgreSQL LISTEN connection was re-established after dropping (each wakes every long-poll)."},
			func() float64 { _, n := ls.ListenStats(); return float64(n) }),
	)
}
