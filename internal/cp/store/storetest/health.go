package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var healthCases = []testCase{
	{"Health/ClaimOncePerSlot", testHealthClaimOncePerSlot},
	{"Health/ClaimConcurrent", testHealthClaimConcurrent},
	{"Health/UpdateKeepsClaim", testHealthUpdateKeepsClaim},
}

// testHealthClaimOncePerSlot: a slot is claimed once; a later slot again;
// an earlier one never; an unknown host never.
func testHealthClaimOncePerSlot(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	claim := func(slot time.Time, want bool) {
		t.Helper()
		got, err := s.ClaimHealthProbe(ctx, "h1", slot)
		must(t, err)
		if got != want {
			t.Fatalf("claim %s = %v, want %v", slot, got, want)
		}
	}
	claim(at(time.Minute), true)
	claim(at(time.Minute), false)
	claim(at(30*time.Second), false)
	claim(at(11*time.Minute), true)
	claim(at(11*time.Minute), false)
	if ok, err := s.ClaimHealthProbe(ctx, "nope", at(time.Hour)); err != nil || ok {
		t.Fatalf("claim unknown host = %v, %v", ok, err)
	}
}

// testHealthClaimConcurrent: of many claimers of one slot (replicas),
// exactly one wins.
func testHealthClaimConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	for round := range 3 {
		slot := at(time.Duration(round+1) * 10 * time.Minute)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins int
		)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := s.ClaimHealthProbe(ctx, "h1", slot)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					wins++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("round %d: %d claimers won, want 1", round, wins)
		}
	}
}

// testHealthUpdateKeepsClaim: UpdateHost (which writes the health fields)
// leaves the claimed slot alone, and a claim leaves the record alone.
func testHealthUpdateKeepsClaim(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createHost(t, s, newHost("h1"))
	if ok, err := s.ClaimHealthProbe(ctx, "h1", at(time.Minute)); err != nil || !ok {
		t.Fatalf("claim = %v, %v", ok, err)
	}
	before, err := s.GetHost(ctx, "h1")
	must(t, err)
	if before.Health != (store.Health{}) {
		t.Fatalf("health before any probe = %+v", before.Health)
	}
	want := store.Health{State: api.HealthHealthy, Summary: "8/8 checks ok", CheckedAt: at(2 * time.Minute), TaskID: "tsk_1"}
	h, err := s.UpdateHost(ctx, "h1", func(h *store.Host) error { h.Health = want; return nil })
	must(t, err)
	diff(t, "health", h.Health, want)
	if ok, err := s.ClaimHealthProbe(ctx, "h1", at(time.Minute)); err != nil || ok {
		t.Fatalf("claim of the same slot after an update = %v, %v", ok, err)
	}
	got, err := s.GetHost(ctx, "h1")
	must(t, err)
	diff(t, "host after claim", got, h)
}
