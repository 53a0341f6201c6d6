package hosts

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
)

// benchFleet is the number of hosts BenchmarkHostCache stores: the size of
// the reconnect storm in docs/performance.md.
const benchFleet = 20000

// BenchmarkHostCache compares the ways the host cache can read a SQLite
// store of benchFleet enrolled hosts (small capabilities, no inventory):
// one host at a time as it did before the refresh existed (the whole row:
// get-host), one host at a time now (the narrow state: get-state; a
// missing or expired entry), the whole fleet in one refresh (refresh-full:
// the first, and one in hostCacheFullEvery), and a refresh of changes
// when none changed for longer than hostCacheSkew (refresh-changes: the
// others, in a quiet fleet); and, for comparison, the health probe
// scheduler's listing of every host each tick (list-liveness). ns/host is
// the cost per host in each.
//
//	go test ./internal/cp/hosts -run '^$' -bench BenchmarkHostCache -benchtime 3x
func BenchmarkHostCache(b *testing.B) {
	st, err := sqlite.Open(b.Context(), filepath.Join(b.TempDir(), "d.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	now := time.Now().Add(-time.Hour)
	caps, _ := json.Marshal(api.Capabilities{Hostname: "h", OSFamily: api.OSLinux, Arch: "amd64", CPUCores: 32,
		RAMTotalMB: 128 << 10, Runtimes: []string{"qemu", "docker"}})
	capa, _ := json.Marshal(api.CapacityReport{Total: api.Capacity{VCPUs: 32, MemoryMiB: 128 << 10}})
	ids := make([]string, benchFleet)
	for i := range ids {
		ids[i] = fmt.Sprintf("host-%05d", i)
		if err := st.CreateHost(b.Context(), store.Host{ID: ids[i], OSFamily: api.OSLinux, Enabled: true,
			Status: api.HostHealthy, Capabilities: caps, Capacity: capa, EnrolledAt: now, LastSeenAt: now,
			CreatedAt: now, Labels: map[string]string{"rack": "r1"}}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("get-host", func(b *testing.B) {
		for b.Loop() {
			c := newHostCache(st, time.Now)
			for _, id := range ids {
				h, err := st.GetHost(b.Context(), id)
				if err != nil {
					b.Fatal(err)
				}
				c.put(h)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchFleet), "ns/host")
	})
	b.Run("get-state", func(b *testing.B) {
		for b.Loop() {
			c := newHostCache(st, time.Now)
			for _, id := range ids {
				if _, err := c.get(b.Context(), id); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchFleet), "ns/host")
	})
	b.Run("list-liveness", func(b *testing.B) {
		for b.Loop() {
			if _, err := st.ListHostLiveness(b.Context()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchFleet), "ns/host")
	})
	for _, full := range []bool{true, false} {
		name := map[bool]string{true: "refresh-full", false: "refresh-changes"}[full]
		b.Run(name, func(b *testing.B) {
			c := newHostCache(st, time.Now)
			if err := c.refresh(b.Context()); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				c.fullNext = full
				c.round = 1 // never a full one by count
				if err := c.refresh(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchFleet), "ns/host")
		})
	}
}
