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

var instanceCases = []testCase{
	{"Instance/CreateGetRoundTrip", testInstanceRoundTrip},
	{"Instance/CreateDefaults", testInstanceDefaults},
	{"Instance/CreateConflict", testInstanceConflict},
	{"Instance/GetNotFound", testInstanceNotFound},
	{"Instance/List", testInstanceList},
	{"Instance/Update", testInstanceUpdate},
	{"Instance/UpdateFnError", testInstanceUpdateFnError},
	{"Instance/UpdateRenameConflict", testInstanceRenameConflict},
	{"Instance/UpdateConcurrent", testInstanceUpdateConcurrent},
	{"Instance/Delete", testInstanceDelete},
	{"Instance/Events", testInstanceEvents},
	{"Host/Draining", testHostDraining},
}

func fullInstance(id, name, host string) store.Instance {
	return store.Instance{
		ID:                 id,
		Name:               name,
		Group:              "web",
		HostID:             host,
		Labels:             map[string]string{"app": "web"},
		Spec:               json.RawMessage(`{"image":{"url":"https://x/img","sha256":"00"},"vcpus":2,"memory_mib":512}`),
		DesiredState:       api.DesiredStopped,
		Generation:         3,
		Phase:              api.InstanceFailed,
		ReasonCode:         api.ReasonVMStartFailed,
		Message:            "qemu exited 1",
		ObservedGeneration: 2,
		Runtime:            json.RawMessage(`{"runtime":"qemu","pid":42}`),
		CreatedBy:          "operator:x",
		CreatedAt:          base,
		UpdatedAt:          at(time.Minute),
		StatusAt:           at(2 * time.Minute),
	}
}

func newInstance(id, name, host string) store.Instance {
	return store.Instance{ID: id, Name: name, HostID: host, Spec: json.RawMessage(`{"vcpus":1}`),
		DesiredState: api.DesiredRunning, Generation: 1, Phase: api.InstancePending, CreatedAt: base, UpdatedAt: base}
}

func createInstance(t *testing.T, s store.Store, in store.Instance) {
	t.Helper()
	must(t, s.CreateInstance(ctxT(t), in))
}

func instanceID(in store.Instance) string { return in.ID }

func testInstanceRoundTrip(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	for _, in := range []store.Instance{fullInstance("i-full", "full", "h1"), newInstance("i-min", "min", "h1")} {
		createInstance(t, s, in)
		got, err := s.GetInstance(ctx, in.ID)
		must(t, err)
		diff(t, "instance "+in.ID, got, in)
		byName, err := s.GetInstanceByName(ctx, in.Name)
		must(t, err)
		diff(t, "instance by name "+in.Name, byName, in)
	}
}

func testInstanceDefaults(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	before := time.Now().Add(-time.Second)
	must(t, s.CreateInstance(ctx, store.Instance{ID: "i-1", Name: "a", HostID: "h1", Labels: map[string]string{}}))
	got, err := s.GetInstance(ctx, "i-1")
	must(t, err)
	if got.DesiredState != api.DesiredRunning || got.Generation != 1 || got.Phase != api.InstancePending {
		t.Errorf("defaults: desired %q generation %d phase %q, want running 1 Pending", got.DesiredState, got.Generation, got.Phase)
	}
	if got.CreatedAt.Before(before) || got.CreatedAt.Location() != time.UTC || !got.UpdatedAt.Equal(got.CreatedAt) {
		t.Errorf("CreatedAt %v UpdatedAt %v, want now in UTC, equal", got.CreatedAt, got.UpdatedAt)
	}
	if got.Labels != nil || got.Spec != nil || got.Runtime != nil || !got.StatusAt.IsZero() {
		t.Errorf("empty fields read back as %v %q %q %v", got.Labels, got.Spec, got.Runtime, got.StatusAt)
	}
	for _, bad := range []store.Instance{{Name: "x", HostID: "h"}, {ID: "i-x", HostID: "h"}, {ID: "i-x", Name: "x"}} {
		if err := s.CreateInstance(ctx, bad); err == nil {
			t.Errorf("CreateInstance(%+v) accepted a record without id, name or host", bad)
		}
	}
}

func testInstanceConflict(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "a", "h1"))
	wantErr(t, s.CreateInstance(ctx, newInstance("i-1", "b", "h1")), store.ErrConflict)
	wantErr(t, s.CreateInstance(ctx, newInstance("i-2", "a", "h2")), store.ErrConflict)
	got, err := s.ListInstances(ctx, store.InstanceFilter{})
	must(t, err)
	diff(t, "ids", ids(got, instanceID), []string{"i-1"})
}

func testInstanceNotFound(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	_, err := s.GetInstance(ctx, "i-nope")
	wantErr(t, err, store.ErrNotFound)
	_, err = s.GetInstanceByName(ctx, "nope")
	wantErr(t, err, store.ErrNotFound)
}

func testInstanceList(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	got, err := s.ListInstances(ctx, store.InstanceFilter{})
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("empty store lists %d instances", len(got))
	}
	for _, in := range []store.Instance{
		newInstance("i-3", "web-2", "h1"), newInstance("i-1", "web-1", "h2"),
		newInstance("i-2", "db-1", "h1"), newInstance("i-4", "lone", "h2"),
	} {
		if in.Name != "lone" {
			in.Group = in.Name[:len(in.Name)-2]
		}
		createInstance(t, s, in)
	}
	for _, tt := range []struct {
		f    store.InstanceFilter
		want []string
	}{
		{store.InstanceFilter{}, []string{"i-2", "i-4", "i-1", "i-3"}}, // by name: db-1, lone, web-1, web-2
		{store.InstanceFilter{HostID: "h1"}, []string{"i-2", "i-3"}},
		{store.InstanceFilter{Group: "web"}, []string{"i-1", "i-3"}},
		{store.InstanceFilter{HostID: "h2", Group: "web"}, []string{"i-1"}},
		{store.InstanceFilter{HostID: "h9"}, []string{}},
	} {
		got, err := s.ListInstances(ctx, tt.f)
		must(t, err)
		diff(t, "list "+tt.f.HostID+"/"+tt.f.Group, ids(got, instanceID), tt.want)
	}
}

func testInstanceUpdate(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "a", "h1"))
	got, err := s.UpdateInstance(ctx, "i-1", func(in *store.Instance) error {
		in.ID, in.CreatedAt = "i-ignored", at(time.Hour)
		in.DesiredState, in.Generation = api.DesiredDeleted, in.Generation+1
		in.Phase, in.ReasonCode, in.Message = api.InstanceReady, "", "up"
		in.ObservedGeneration, in.Runtime, in.StatusAt = 1, json.RawMessage(`{"pid":7}`), at(time.Minute)
		in.Labels = map[string]string{"k": "v"}
		return nil
	})
	must(t, err)
	if got.ID != "i-1" || !got.CreatedAt.Equal(base) || got.DesiredState != api.DesiredDeleted || got.Generation != 2 ||
		got.Phase != api.InstanceReady || string(got.Runtime) != `{"pid":7}` || got.Labels["k"] != "v" {
		t.Fatalf("UpdateInstance returned %+v", got)
	}
	if !got.UpdatedAt.After(base) {
		t.Errorf("UpdatedAt = %v, want set to now", got.UpdatedAt)
	}
	stored, err := s.GetInstance(ctx, "i-1")
	must(t, err)
	diff(t, "stored instance", stored, got)
	if _, err := s.GetInstance(ctx, "i-ignored"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fn renamed the id: %v", err)
	}
	got, err = s.UpdateInstance(ctx, "i-1", func(in *store.Instance) error { in.UpdatedAt = at(time.Minute); return nil })
	must(t, err)
	if !got.UpdatedAt.Equal(at(time.Minute)) {
		t.Errorf("explicit UpdatedAt = %v, want %v", got.UpdatedAt, at(time.Minute))
	}
	called := false
	_, err = s.UpdateInstance(ctx, "i-nope", func(*store.Instance) error { called = true; return nil })
	wantErr(t, err, store.ErrNotFound)
	if called {
		t.Error("fn called for a missing instance")
	}
}

func testInstanceUpdateFnError(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	in := newInstance("i-1", "a", "h1")
	createInstance(t, s, in)
	boom := errors.New("boom")
	_, err := s.UpdateInstance(ctx, "i-1", func(in *store.Instance) error {
		in.Phase = api.InstanceFailed
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want fn's error", err)
	}
	got, err := s.GetInstance(ctx, "i-1")
	must(t, err)
	diff(t, "instance after failed update", got, in)
}

func testInstanceRenameConflict(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "a", "h1"))
	createInstance(t, s, newInstance("i-2", "b", "h1"))
	_, err := s.UpdateInstance(ctx, "i-2", func(in *store.Instance) error { in.Name = "a"; return nil })
	wantErr(t, err, store.ErrConflict)
	got, err := s.GetInstance(ctx, "i-2")
	must(t, err)
	if got.Name != "b" {
		t.Fatalf("name after a refused rename: %q", got.Name)
	}
}

// testInstanceUpdateConcurrent checks the row lock: concurrent generation
// bumps must not be lost.
func testInstanceUpdateConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "a", "h1"))
	const workers, each = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				if _, err := s.UpdateInstance(ctx, "i-1", func(in *store.Instance) error { in.Generation++; return nil }); err != nil {
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
	got, err := s.GetInstance(ctx, "i-1")
	must(t, err)
	if got.Generation != 1+workers*each {
		t.Fatalf("generation = %d, want %d (lost updates)", got.Generation, 1+workers*each)
	}
}

func testInstanceDelete(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createInstance(t, s, newInstance("i-1", "a", "h1"))
	must(t, s.DeleteInstance(ctx, "i-1"))
	_, err := s.GetInstance(ctx, "i-1")
	wantErr(t, err, store.ErrNotFound)
	wantErr(t, s.DeleteInstance(ctx, "i-1"), store.ErrNotFound)
	// The name is free again.
	createInstance(t, s, newInstance("i-2", "a", "h1"))
}

func testInstanceEvents(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	ch := subscribe(t, s)
	ev := func(host string) store.Event { return store.Event{Kind: store.EventInstance, ID: host} }

	createInstance(t, s, newInstance("i-1", "a", "h1"))
	waitEvent(t, ch, ev("h1"))

	// A refused create publishes nothing.
	_ = s.CreateInstance(ctx, newInstance("i-1", "b", "h9"))
	noEvent(t, ch, ev("h9"), 200*time.Millisecond)

	_, err := s.UpdateInstance(ctx, "i-1", func(in *store.Instance) error { in.Generation++; return nil })
	must(t, err)
	waitEvent(t, ch, ev("h1"))

	// A failed update publishes nothing.
	_, _ = s.UpdateInstance(ctx, "i-1", func(*store.Instance) error { return errors.New("no") })
	noEvent(t, ch, ev("h1"), 200*time.Millisecond)

	// Moving an instance tells both hosts.
	_, err = s.UpdateInstance(ctx, "i-1", func(in *store.Instance) error { in.HostID = "h2"; return nil })
	must(t, err)
	seen := map[store.Event]bool{}
	timeout := time.After(10 * time.Second)
	for !seen[ev("h1")] || !seen[ev("h2")] {
		select {
		case e := <-ch:
			seen[e] = true
		case <-timeout:
			t.Fatalf("move: events %v, want instance events for h1 and h2", seen)
		}
	}

	must(t, s.DeleteInstance(ctx, "i-1"))
	waitEvent(t, ch, ev("h2"))
}

func testHostDraining(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	ch := subscribe(t, s)
	got, err := s.UpdateHost(ctx, "h1", func(h *store.Host) error { h.Draining = true; return nil })
	must(t, err)
	if !got.Draining {
		t.Fatal("UpdateHost did not set Draining")
	}
	waitEvent(t, ch, store.Event{Kind: store.EventHost, ID: "h1"})
	stored, err := s.GetHost(ctx, "h1")
	must(t, err)
	if !stored.Draining {
		t.Fatal("Draining not stored")
	}
	got, err = s.UpdateHost(ctx, "h1", func(h *store.Host) error { h.Draining = false; return nil })
	must(t, err)
	if got.Draining {
		t.Fatal("Draining not cleared")
	}
}
