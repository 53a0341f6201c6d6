package keys

import (
	"bytes"
	"errors"
	"testing"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
)

// TestSealWorkloadSecretsRotatesTheKEK: after a rotation (a ring with the
// new KEK first and the old one behind) every workload secret is sealed
// with the new KEK, opens with it alone, and no longer opens with the old
// one (a clear ErrKEKMismatch naming the secret's KEK); a second run
// rewrites nothing.
func TestSealWorkloadSecretsRotatesTheKEK(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, sqlite.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	oldKey, err := kek.Generate()
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := kek.Generate()
	if err != nil {
		t.Fatal(err)
	}
	oldKeys := &Keys{rest: atRest{ring: kek.NewRing(oldKey)}}
	values := map[string][]byte{"db-password": []byte("pw-1"), "api-token": []byte("tok-2")}
	for name, v := range values {
		sealed, err := oldKeys.SealWorkloadSecret(name, v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: name, Value: sealed, UpdatedBy: "test"}, nil); err != nil {
			t.Fatal(err)
		}
	}

	n, err := SealWorkloadSecrets(ctx, st, kek.NewRing(newKey, oldKey), quiet())
	if err != nil || n != len(values) {
		t.Fatalf("rotate: %d rewritten, %v; want %d", n, err, len(values))
	}
	newKeys := &Keys{rest: atRest{ring: kek.NewRing(newKey)}}
	for name, v := range values {
		ws, err := st.GetWorkloadSecret(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if ws.Version != 1 {
			t.Errorf("%s: version %d after a re-seal, want 1 (same value)", name, ws.Version)
		}
		got, err := newKeys.OpenWorkloadSecret(name, ws.Value)
		if err != nil || !bytes.Equal(got, v) {
			t.Errorf("%s with the new KEK alone: %q, %v", name, got, err)
		}
		if _, err := oldKeys.OpenWorkloadSecret(name, ws.Value); !errors.Is(err, ErrKEKMismatch) {
			t.Errorf("%s with the old KEK: %v, want ErrKEKMismatch", name, err)
		}
	}
	if n, err := SealWorkloadSecrets(ctx, st, kek.NewRing(newKey, oldKey), quiet()); err != nil || n != 0 {
		t.Errorf("second run: %d rewritten, %v; want 0", n, err)
	}
	// A ring without the KEK a secret is sealed with: a clear error.
	other, _ := kek.Generate()
	if _, err := SealWorkloadSecrets(ctx, st, kek.NewRing(other), quiet()); !errors.Is(err, ErrKEKMismatch) {
		t.Errorf("a ring lacking the secrets' KEK: %v, want ErrKEKMismatch", err)
	}
}
