package instances

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/api"
)

// racingStore is another replica placing onto the same host: before the
// first instance this replica inserts, it inserts one of its own that
// takes the whole host.
type racingStore struct {
	store.Store
	once  sync.Once
	rival store.Instance
}

func (r *racingStore) CreateInstanceRecorded(ctx context.Context, in store.Instance, ev store.InstanceEvent, records ...store.AuditEvent) error {
	var err error
	r.once.Do(func() {
		r.rival.HostID = in.HostID
		err = r.Store.CreateInstance(ctx, r.rival)
	})
	if err != nil {
		return err
	}
	return r.Store.CreateInstanceRecorded(ctx, in, ev, records...)
}

// TestCreateLosesPlacementRace: an instance whose host another replica
// filled meanwhile is removed, with a record saying why, and placed again
// on another host; each instance stored has its creation record.
func TestCreateLosesPlacementRace(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, sqlite.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := func() time.Time { return time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC) }
	// big is chosen first (more free memory); each takes one instance.
	for _, h := range []store.Host{
		capHost("big", api.HostHealthy, api.Capacity{VCPUs: 2, MemoryMiB: 4096, DiskGiB: 20}, nil),
		capHost("small", api.HostHealthy, api.Capacity{VCPUs: 2, MemoryMiB: 2048, DiskGiB: 20}, nil),
	} {
		if err := st.CreateHost(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	rs := &racingStore{Store: st, rival: store.Instance{ID: "i-rival", Name: "rival", Spec: []byte(`{"vcpus":2,"memory_mib":1024}`),
		DesiredState: api.DesiredRunning}}
	log := slog.New(slog.DiscardHandler)
	room := New(Config{Log: log, Now: now}, rs, audit.New(st, now, log))
	f, err := room.loadFleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in, err := room.createPlaced(ctx, f, api.CreateInstanceRequest{Name: "web", Spec: api.InstanceSpec{VCPUs: 2, MemoryMiB: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	if in.HostID != "small" || rs.rival.HostID != "big" {
		t.Fatalf("web placed on %q with the rival on %q; want small, after losing big", in.HostID, rs.rival.HostID)
	}
	all, err := st.ListInstances(ctx, store.InstanceFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range all {
		ids = append(ids, i.ID)
	}
	slices.Sort(ids)
	wantIDs := []string{"i-rival", in.ID}
	slices.Sort(wantIDs)
	if !slices.Equal(ids, wantIDs) {
		t.Fatalf("instances %v, want %v: the loser's record must be gone", ids, wantIDs)
	}
	evs, err := st.ListAudit(ctx, store.AuditFilter{Action: "instance.delete"})
	if err != nil || len(evs) != 1 || evs[0].Result != "placement_lost" {
		t.Fatalf("removal records %+v, %v; want one placement_lost", evs, err)
	}
	lost := evs[0].Target
	for id, want := range map[string][]string{lost: {"instance.create ok", "instance.delete placement_lost"}, in.ID: {"instance.create ok"}} {
		recs, err := st.ListAudit(ctx, store.AuditFilter{Target: id})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range slices.Backward(recs) {
			got = append(got, e.Action+" "+e.Result)
		}
		if !slices.Equal(got, want) {
			t.Errorf("records of %s: %v, want %v", id, got, want)
		}
	}
}
