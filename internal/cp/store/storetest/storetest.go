// Package storetest owns the conformance suite of store.Store: every
// adapter (sqlite, postgres) runs the same table of subtests through Run,
// which pins down the semantics documented on the interface (not-found and
// conflict errors, claim ordering and atomicity, leases and reaping, result
// idempotency, change events, liveness updates, instance records and their
// bounded event history, allocations, single-use terminal tokens,
// first-writer-wins secrets, key retirement, audit ordering, UTC
// millisecond timestamps).
package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Opener returns a fresh, empty store for one subtest and arranges for it to
// be closed when the subtest ends.
type Opener func(t *testing.T) store.Store

type testCase struct {
	name string
	fn   func(t *testing.T, s store.Store)
}

// Run runs the conformance suite; each subtest gets its own store from open
// and runs in parallel with the others.
func Run(t *testing.T, open Opener) {
	var cases []testCase
	cases = append(cases, hostCases...)
	cases = append(cases, hostStatusCases...)
	cases = append(cases, taskCases...)
	cases = append(cases, miscCases...)
	cases = append(cases, slotCases...)
	cases = append(cases, instanceCases...)
	cases = append(cases, instanceEventCases...)
	cases = append(cases, allocationCases...)
	cases = append(cases, terminalCases...)
	cases = append(cases, keyCases...)
	cases = append(cases, preflightCases...)
	cases = append(cases, workloadSecretCases...)
	cases = append(cases, healthCases...)
	cases = append(cases, sliceCases...)
	cases = append(cases, dashboardSessionCases...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// base is the suite's reference time: UTC, whole milliseconds.
var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return base.Add(d) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want %v", err, target)
	}
}

func diff(t *testing.T, what string, got, want any) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("%s mismatch (-want +got):\n%s", what, d)
	}
}

func newHost(id string) store.Host {
	return store.Host{
		ID:        id,
		OSFamily:  api.OSLinux,
		Enabled:   true,
		Status:    api.HostUnknown,
		CreatedAt: base,
		UpdatedAt: base,
	}
}

func createHost(t *testing.T, s store.Store, h store.Host) {
	t.Helper()
	must(t, s.CreateHost(ctxT(t), h))
}

func newTask(id, node string, created time.Duration) store.Task {
	return store.Task{
		ID:            id,
		NodeID:        node,
		Type:          "diag.health_probe",
		Params:        []byte(`{"depth":1}`),
		CorrelationID: "corr-" + id,
		CreatedBy:     "op",
		CreatedAt:     at(created),
		ExpiresAt:     at(time.Hour),
	}
}

func enqueue(t *testing.T, s store.Store, ts ...store.Task) {
	t.Helper()
	for _, task := range ts {
		must(t, s.EnqueueTask(ctxT(t), task))
	}
}

func getTask(t *testing.T, s store.Store, id string) store.Task {
	t.Helper()
	task, err := s.GetTask(ctxT(t), id)
	must(t, err)
	return task
}

func claim(t *testing.T, s store.Store, node string, now, lease time.Duration) store.Task {
	t.Helper()
	task, ok, err := s.ClaimTask(ctxT(t), node, at(now), at(lease))
	must(t, err)
	if !ok {
		t.Fatalf("ClaimTask(%q) found nothing", node)
	}
	return task
}

func subscribe(t *testing.T, s store.Store) <-chan store.Event {
	t.Helper()
	ch, err := s.Subscribe(ctxT(t))
	must(t, err)
	return ch
}

// waitEvent reads ch until want arrives; other events are skipped.
func waitEvent(t *testing.T, ch <-chan store.Event, want store.Event) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed while waiting for %+v", want)
			}
			if ev == want {
				return
			}
		case <-timeout:
			t.Fatalf("no event %+v within 10s", want)
		}
	}
}

// noEvent checks that want does not arrive within d.
func noEvent(t *testing.T, ch <-chan store.Event, want store.Event, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return
			}
			if ev == want {
				t.Fatalf("unexpected event %+v", ev)
			}
		case <-timeout:
			return
		}
	}
}

func ids[T any](xs []T, id func(T) string) []string {
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		out = append(out, id(x))
	}
	return out
}

func taskID(t store.Task) string { return t.ID }

func nth(prefix string, i int) string { return fmt.Sprintf("%s-%03d", prefix, i) }
