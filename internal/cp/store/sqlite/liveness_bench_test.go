package sqlite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
	"github.com/drover-dev/drover/internal/wire/api"
)

// BenchmarkTouchHosts is one heartbeat flush of 20,000 hosts: the batched
// statements (touchHosts, what the store uses) against sqlstore's portable
// per-host loop (a store opened without the hook), and the batch when every
// host was stale (a fleet back after a restart or a partition: each one
// revived). ns/host is per host.
//
//	go test ./internal/cp/store/sqlite -run '^$' -bench BenchmarkTouchHosts -benchtime 5x
func BenchmarkTouchHosts(b *testing.B) {
	const n = 20000
	for _, tc := range []struct {
		name         string
		batch, stale bool
	}{{"batch", true, false}, {"batch-all-stale", true, true}, {"per-host-loop", false, false}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := Open(b.Context(), b.TempDir()+"/d.db")
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			st := s.Store
			if !tc.batch {
				st = sqlstore.New(s.db, sqlstore.Dialect{Name: "sqlite"})
			}
			now := time.Now()
			for i := range n {
				if err := s.CreateHost(b.Context(), store.Host{ID: fmt.Sprintf("host-%05d", i), OSFamily: api.OSLinux,
					Enabled: true, Status: api.HostHealthy, LastSeenAt: now}); err != nil {
					b.Fatal(err)
				}
			}
			seen := make([]store.Seen, n)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				at := now.Add(time.Duration(i+1) * time.Second)
				for j := range seen {
					seen[j] = store.Seen{HostID: fmt.Sprintf("host-%05d", j), At: at}
				}
				if tc.stale {
					b.StopTimer()
					if _, err := s.db.Exec(b.Context(), `UPDATE hosts SET status = 'stale'`); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				revived, err := st.TouchHosts(context.Background(), seen, nil)
				if err != nil {
					b.Fatal(err)
				}
				if tc.stale && len(revived) != n {
					b.Fatalf("revived %d hosts, want %d", len(revived), n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/host")
		})
	}
}

// BenchmarkMarkStale is one stale sweep that finds every one of 20,000
// hosts silent (a partition, or the control plane's own network): each
// host's status, last failure, change event and audit record written in
// the transaction that marks it (500 hosts to one). ns/host is per host.
//
//	go test ./internal/cp/store/sqlite -run '^$' -bench BenchmarkMarkStale -benchtime 3x
func BenchmarkMarkStale(b *testing.B) {
	const n = 20000
	s, err := Open(b.Context(), b.TempDir()+"/d.db")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	seen := time.Now().Add(-time.Hour)
	for i := range n {
		if err := s.CreateHost(b.Context(), store.Host{ID: fmt.Sprintf("host-%05d", i), OSFamily: api.OSLinux,
			Enabled: true, Status: api.HostHealthy, LastSeenAt: seen}); err != nil {
			b.Fatal(err)
		}
	}
	mark := func(id string, lastSeen time.Time) store.StaleMark {
		return store.StaleMark{
			Failure: store.Failure{Signal: "heartbeat_stale", CorrelationID: "cid_" + id, At: time.Now(),
				Detail: "no heartbeat since " + lastSeen.Format(time.RFC3339)},
			Audit: store.AuditEvent{Actor: "system", Action: "host.status", Target: id, Result: "stale",
				CorrelationID: "cid_" + id, Detail: "from=heartbeating reason=heartbeat_stale"},
		}
	}
	for b.Loop() {
		b.StopTimer()
		if _, err := s.db.Exec(b.Context(), `UPDATE hosts SET status = 'healthy'`); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		marked, err := s.MarkStale(b.Context(), time.Now(), mark)
		if err != nil {
			b.Fatal(err)
		}
		if len(marked) != n {
			b.Fatalf("marked %d hosts, want %d", len(marked), n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/host")
}
