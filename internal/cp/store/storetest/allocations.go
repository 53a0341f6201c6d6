package storetest

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var allocationCases = []testCase{
	{"Allocation/CreateGetRoundTrip", testAllocationRoundTrip},
	{"Allocation/CreateDefaults", testAllocationDefaults},
	{"Allocation/CreateConflict", testAllocationConflict},
	{"Allocation/GetNotFound", testAllocationNotFound},
	{"Allocation/List", testAllocationList},
	{"Allocation/Update", testAllocationUpdate},
	{"Allocation/UpdateFnError", testAllocationUpdateFnError},
	{"Allocation/UpdateConcurrent", testAllocationUpdateConcurrent},
	{"Allocation/TimestampsUTC", testAllocationTimestampsUTC},
	{"Allocation/UpdateEvent", testAllocationUpdateEvent},
}

func newAllocation(id, host, instance string, created time.Duration) store.Allocation {
	return store.Allocation{
		ID:         id,
		Username:   "alice",
		HostID:     host,
		InstanceID: instance,
		State:      api.AllocationActive,
		CreatedAt:  at(created),
		UpdatedAt:  at(created),
	}
}

func fullAllocation(id string) store.Allocation {
	return store.Allocation{
		ID:              id,
		Username:        "bob",
		HostID:          "h1",
		InstanceID:      "i-1",
		State:           api.AllocationFailed,
		StateReason:     "useradd_failed: exit 9",
		Spec:            json.RawMessage(`{"username":"bob","ssh_authorized_keys":["ssh-ed25519 AAAA"],"sudo":true}`),
		ProvisionTaskID: "t-prov",
		ReleaseTaskID:   "t-rel",
		CreatedBy:       "operator:x",
		CreatedAt:       base,
		UpdatedAt:       at(time.Minute),
	}
}

func createAllocation(t *testing.T, s store.Store, a store.Allocation) {
	t.Helper()
	must(t, s.CreateAllocation(ctxT(t), a))
}

func allocationID(a store.Allocation) string { return a.ID }

func testAllocationRoundTrip(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for _, a := range []store.Allocation{fullAllocation("a-full"), newAllocation("a-min", "h1", "", 0)} {
		createAllocation(t, s, a)
		got, err := s.GetAllocation(ctx, a.ID)
		must(t, err)
		diff(t, "allocation "+a.ID, got, a)
	}
}

func testAllocationDefaults(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	before := time.Now().Add(-time.Second)
	must(t, s.CreateAllocation(ctx, store.Allocation{ID: "a-1", Username: "u", HostID: "h1"}))
	got, err := s.GetAllocation(ctx, "a-1")
	must(t, err)
	if got.State != api.AllocationProvisioning {
		t.Errorf("default state %q, want provisioning", got.State)
	}
	if got.CreatedAt.Before(before) || got.CreatedAt.Location() != time.UTC || !got.UpdatedAt.Equal(got.CreatedAt) {
		t.Errorf("CreatedAt %v UpdatedAt %v, want now in UTC, equal", got.CreatedAt, got.UpdatedAt)
	}
	if got.Spec != nil || got.InstanceID != "" {
		t.Errorf("empty fields read back as %q %q", got.Spec, got.InstanceID)
	}
	for _, bad := range []store.Allocation{
		{Username: "u", HostID: "h"}, {ID: "a-x", HostID: "h"}, {ID: "a-x", Username: "u"},
		{ID: "a-x", Username: "u", HostID: "h", State: "bogus"},
	} {
		if err := s.CreateAllocation(ctx, bad); err == nil {
			t.Errorf("CreateAllocation(%+v) accepted a record without id, username or host, or with an unknown state", bad)
		}
	}
}

func testAllocationConflict(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createAllocation(t, s, newAllocation("a-1", "h1", "", 0))
	wantErr(t, s.CreateAllocation(ctx, newAllocation("a-1", "h2", "", time.Second)), store.ErrConflict)
	got, err := s.GetAllocation(ctx, "a-1")
	must(t, err)
	if got.HostID != "h1" {
		t.Fatalf("a refused create overwrote the record: host %q", got.HostID)
	}
}

func testAllocationNotFound(t *testing.T, s store.Store) {
	_, err := s.GetAllocation(ctxT(t), "a-nope")
	wantErr(t, err, store.ErrNotFound)
}

func testAllocationList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	got, err := s.ListAllocations(ctx, store.AllocationFilter{})
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("empty store lists %d allocations", len(got))
	}
	released := newAllocation("a-4", "h2", "", 4*time.Second)
	released.State = api.AllocationReleased
	for _, a := range []store.Allocation{
		newAllocation("a-3", "h1", "i-1", 3*time.Second),
		newAllocation("a-1", "h1", "", time.Second),
		released,
		newAllocation("a-2", "h2", "i-2", time.Second), // same time as a-1: id breaks the tie
		newAllocation("a-0", "h1", "i-1", 5*time.Second),
	} {
		createAllocation(t, s, a)
	}
	for _, tt := range []struct {
		name string
		f    store.AllocationFilter
		want []string
	}{
		{"all oldest first", store.AllocationFilter{}, []string{"a-1", "a-2", "a-3", "a-4", "a-0"}},
		{"host", store.AllocationFilter{HostID: "h1"}, []string{"a-1", "a-3", "a-0"}},
		{"instance", store.AllocationFilter{InstanceID: "i-1"}, []string{"a-3", "a-0"}},
		{"state", store.AllocationFilter{State: api.AllocationReleased}, []string{"a-4"}},
		{"host and state", store.AllocationFilter{HostID: "h2", State: api.AllocationActive}, []string{"a-2"}},
		{"host and instance", store.AllocationFilter{HostID: "h2", InstanceID: "i-1"}, []string{}},
		{"unknown host", store.AllocationFilter{HostID: "h9"}, []string{}},
	} {
		got, err := s.ListAllocations(ctx, tt.f)
		must(t, err)
		diff(t, "list "+tt.name, ids(got, allocationID), tt.want)
	}
}

func testAllocationUpdate(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createAllocation(t, s, newAllocation("a-1", "h1", "", 0))
	got, err := s.UpdateAllocation(ctx, "a-1", func(a *store.Allocation) error {
		a.ID, a.CreatedAt = "a-ignored", at(time.Hour)
		a.State, a.StateReason = api.AllocationReleasing, "operator"
		a.ReleaseTaskID, a.Spec = "t-rel", json.RawMessage(`{"username":"alice"}`)
		a.UpdatedAt = at(2 * time.Minute)
		return nil
	})
	must(t, err)
	want := newAllocation("a-1", "h1", "", 0)
	want.State, want.StateReason, want.ReleaseTaskID = api.AllocationReleasing, "operator", "t-rel"
	want.Spec, want.UpdatedAt = json.RawMessage(`{"username":"alice"}`), at(2*time.Minute)
	diff(t, "updated allocation", got, want)
	stored, err := s.GetAllocation(ctx, "a-1")
	must(t, err)
	diff(t, "stored allocation", stored, want)
	if _, err := s.GetAllocation(ctx, "a-ignored"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fn renamed the id: %v", err)
	}

	// UpdatedAt is stored as fn leaves it.
	got, err = s.UpdateAllocation(ctx, "a-1", func(a *store.Allocation) error { a.State = api.AllocationReleased; return nil })
	must(t, err)
	if got.State != api.AllocationReleased || !got.UpdatedAt.Equal(at(2*time.Minute)) {
		t.Errorf("state %q UpdatedAt %v, want released, %v", got.State, got.UpdatedAt, at(2*time.Minute))
	}

	called := false
	_, err = s.UpdateAllocation(ctx, "a-nope", func(*store.Allocation) error { called = true; return nil })
	wantErr(t, err, store.ErrNotFound)
	if called {
		t.Error("fn called for a missing allocation")
	}
	// A state the schema does not know is refused and changes nothing.
	_, err = s.UpdateAllocation(ctx, "a-1", func(a *store.Allocation) error { a.State = "bogus"; return nil })
	if err == nil {
		t.Fatal("UpdateAllocation stored an unknown state")
	}
	stored, err = s.GetAllocation(ctx, "a-1")
	must(t, err)
	if stored.State != api.AllocationReleased {
		t.Fatalf("state after a refused update: %q", stored.State)
	}
}

func testAllocationUpdateFnError(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	a := newAllocation("a-1", "h1", "", 0)
	createAllocation(t, s, a)
	boom := errors.New("boom")
	_, err := s.UpdateAllocation(ctx, "a-1", func(a *store.Allocation) error {
		a.State, a.UpdatedAt = api.AllocationFailed, at(time.Hour)
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want fn's error", err)
	}
	got, err := s.GetAllocation(ctx, "a-1")
	must(t, err)
	diff(t, "allocation after failed update", got, a)
}

// testAllocationUpdateConcurrent checks the row lock: concurrent
// read-modify-writes must not be lost.
func testAllocationUpdateConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createAllocation(t, s, newAllocation("a-1", "h1", "", 0))
	const workers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				if _, err := s.UpdateAllocation(ctx, "a-1", func(a *store.Allocation) error {
					a.StateReason += "x"
					return nil
				}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := s.GetAllocation(ctx, "a-1")
	must(t, err)
	if len(got.StateReason) != workers*each {
		t.Fatalf("%d appends survived, want %d (lost updates)", len(got.StateReason), workers*each)
	}
}

func testAllocationTimestampsUTC(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	zone := time.FixedZone("UTC-7", -7*3600)
	local := time.Date(2025, 3, 1, 5, 0, 0, 987654321, zone)
	a := newAllocation("a-1", "h1", "", 0)
	a.CreatedAt, a.UpdatedAt = local, local
	createAllocation(t, s, a)
	want := local.Truncate(time.Millisecond).UTC()
	check := func(what string, got store.Allocation) {
		t.Helper()
		for name, v := range map[string]time.Time{"CreatedAt": got.CreatedAt, "UpdatedAt": got.UpdatedAt} {
			if v != want {
				t.Errorf("%s: %s = %v (%v), want %v UTC", what, name, v, v.Location(), want)
			}
		}
	}
	got, err := s.GetAllocation(ctx, "a-1")
	must(t, err)
	check("get", got)
	list, err := s.ListAllocations(ctx, store.AllocationFilter{})
	must(t, err)
	check("list", list[0])
	got, err = s.UpdateAllocation(ctx, "a-1", func(a *store.Allocation) error { a.UpdatedAt = local; return nil })
	must(t, err)
	check("update", got)
}

// testAllocationUpdateEvent: an update publishes EventAllocation for the
// allocation (gateways end its terminals on release); a failed one does
// not.
func testAllocationUpdateEvent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createAllocation(t, s, newAllocation("a-1", "h1", "", 0))
	createAllocation(t, s, newAllocation("a-2", "h1", "", 0))
	ch := subscribe(t, s)
	_, err := s.UpdateAllocation(ctx, "a-2", func(*store.Allocation) error { return errors.New("boom") })
	if err == nil {
		t.Fatal("fn's error not returned")
	}
	_, err = s.UpdateAllocation(ctx, "a-1", func(a *store.Allocation) error {
		a.State, a.UpdatedAt = api.AllocationReleased, at(time.Hour)
		return nil
	})
	must(t, err)
	waitEvent(t, ch, store.Event{Kind: store.EventAllocation, ID: "a-1"})
	noEvent(t, ch, store.Event{Kind: store.EventAllocation, ID: "a-2"}, 200*time.Millisecond)
}
