package storetest

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

// workloadSecretCases cover the workload secrets table: create, replace
// (version bump, creator kept), list without values, delete, and
// concurrent replacements each counted once, and the conditional
// re-seal of a KEK rotation.
var workloadSecretCases = []testCase{
	{"WorkloadSecret/Lifecycle", testWorkloadSecretLifecycle},
	{"WorkloadSecret/ConcurrentPut", testWorkloadSecretConcurrentPut},
	{"WorkloadSecret/Replace", testWorkloadSecretReplace},
}

// testWorkloadSecretReplace: ReplaceWorkloadSecret swaps the value only if
// it is still the one read, keeping version and times; ErrConflict after
// another write, ErrNotFound for an absent name.
func testWorkloadSecretReplace(t *testing.T, s store.Store) {
	ctx := t.Context()
	put, err := s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "db", Value: []byte("sealed-old"), UpdatedBy: "op"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReplaceWorkloadSecret(ctx, "db", []byte("sealed-old"), []byte("sealed-new")); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetWorkloadSecret(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	want := put
	want.Value = []byte("sealed-new")
	diff(t, "after replace", got, want)
	wantErr(t, s.ReplaceWorkloadSecret(ctx, "db", []byte("sealed-old"), []byte("sealed-x")), store.ErrConflict)
	wantErr(t, s.ReplaceWorkloadSecret(ctx, "absent", []byte("a"), []byte("b")), store.ErrNotFound)
}

func testWorkloadSecretLifecycle(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	_, err := s.GetWorkloadSecret(ctx, "db-password")
	wantErr(t, err, store.ErrNotFound)
	wantErr(t, s.DeleteWorkloadSecret(ctx, "db-password"), store.ErrNotFound)
	if _, err := s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "empty"}, nil); err == nil {
		t.Fatal("put with an empty value: want an error")
	}

	v1 := []byte("sealed-1\x00\xff")
	got, err := s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "db-password", Value: v1,
		UpdatedBy: "operator:alice", UpdatedAt: at(0)}, nil)
	must(t, err)
	diff(t, "created", got, store.WorkloadSecret{Name: "db-password", Value: v1, Version: 1,
		CreatedBy: "operator:alice", CreatedAt: at(0), UpdatedBy: "operator:alice", UpdatedAt: at(0)})

	v2 := []byte("sealed-2")
	got, err = s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "db-password", Value: v2,
		UpdatedBy: "operator:bob", UpdatedAt: at(time.Minute)}, nil)
	must(t, err)
	diff(t, "replaced", got, store.WorkloadSecret{Name: "db-password", Value: v2, Version: 2,
		CreatedBy: "operator:alice", CreatedAt: at(0), UpdatedBy: "operator:bob", UpdatedAt: at(time.Minute)})
	read, err := s.GetWorkloadSecret(ctx, "db-password")
	must(t, err)
	diff(t, "get", read, got)

	_, err = s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "api.token", Value: []byte("x"),
		UpdatedBy: "operator:alice", UpdatedAt: at(2 * time.Minute)}, nil)
	must(t, err)
	list, err := s.ListWorkloadSecrets(ctx)
	must(t, err)
	if len(list) != 2 || list[0].Name != "api.token" || list[1].Name != "db-password" || list[1].Version != 2 {
		t.Fatalf("list = %+v, want api.token then db-password v2", list)
	}
	for _, ws := range list {
		if ws.Value != nil {
			t.Fatalf("list returned a value for %s", ws.Name)
		}
	}

	must(t, s.DeleteWorkloadSecret(ctx, "db-password"))
	_, err = s.GetWorkloadSecret(ctx, "db-password")
	wantErr(t, err, store.ErrNotFound)
	// Recreated after a delete, it starts again at version 1.
	got, err = s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "db-password", Value: v1, UpdatedBy: "operator:carol"}, nil)
	must(t, err)
	if got.Version != 1 || got.CreatedBy != "operator:carol" || got.CreatedAt.IsZero() || !bytes.Equal(got.Value, v1) {
		t.Fatalf("recreated = %+v, want version 1 by carol, now", got)
	}
}

// testWorkloadSecretConcurrentPut: replicas replacing one secret at once
// each bump the version exactly once.
func testWorkloadSecretConcurrentPut(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	_, err := s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "shared", Value: []byte("v0")}, nil)
	must(t, err)
	const workers = 8
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for i := range workers {
		wg.Go(func() {
			_, errs[i] = s.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: "shared", Value: []byte{byte('a' + i)}}, nil)
		})
	}
	wg.Wait()
	for _, err := range errs {
		must(t, err)
	}
	got, err := s.GetWorkloadSecret(ctx, "shared")
	must(t, err)
	if got.Version != workers+1 {
		t.Fatalf("version = %d, want %d", got.Version, workers+1)
	}
}
