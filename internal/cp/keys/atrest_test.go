package keys

import (
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlite"
	"github.com/drover-dev/drover/internal/wire/task"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testRing(t *testing.T) *kek.Ring {
	t.Helper()
	k, err := kek.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return kek.NewRing(k)
}

// TestSealedKeysAreBoundToTheirRow: someone who can write the database but
// has no KEK cannot move a sealed key to another row, nor slip in a
// plaintext signing key of their own, nor alter a sealed one.
func TestSealedKeysAreBoundToTheirRow(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, sqlite.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ring := testRing(t)
	if _, err := Open(ctx, st, Config{KEK: ring, Log: quiet(), Now: time.Now}); err != nil {
		t.Fatal(err)
	}
	keys, err := st.ListSigningKeys(ctx)
	if err != nil || len(keys) != 1 {
		t.Fatalf("signing keys %v, %v", keys, err)
	}
	kr := &Keys{st: st, now: time.Now, rest: atRest{ring: ring}}
	if err := kr.reload(ctx); err != nil {
		t.Fatalf("reload of the genuine key: %v", err)
	}

	// The CA key's sealed value copied into a signing-key row.
	caSealed, err := st.GetSecret(ctx, caKeySecret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RotateSigningKey(ctx, store.SigningKey{KID: "moved", PrivateKey: caSealed, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := kr.reload(ctx); err == nil || !errors.Is(err, kek.ErrDecrypt) {
		t.Fatalf("reload with a moved sealed value: %v, want a decryption failure", err)
	}

	// A planted plaintext key (the attacker's own) is refused.
	st2, _ := sqlite.Open(ctx, sqlite.MemoryPath)
	t.Cleanup(func() { st2.Close() })
	if _, err := Open(ctx, st2, Config{KEK: ring, Log: quiet(), Now: time.Now}); err != nil {
		t.Fatal(err)
	}
	kid, priv, _ := task.GenerateKey()
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	if err := st2.RotateSigningKey(ctx, store.SigningKey{KID: kid, PrivateKey: der, CreatedAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	kr2 := &Keys{st: st2, now: time.Now, rest: atRest{ring: ring}}
	if err := kr2.reload(ctx); err == nil || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("reload with a planted plaintext key: %v", err)
	}

	// A flipped bit in the CA key: the next start refuses.
	st3, _ := sqlite.Open(ctx, sqlite.MemoryPath)
	t.Cleanup(func() { st3.Close() })
	if _, err := Open(ctx, st3, Config{KEK: ring, Log: quiet(), Now: time.Now}); err != nil {
		t.Fatal(err)
	}
	v, _ := st3.GetSecret(ctx, caKeySecret)
	bad := append([]byte(nil), v...)
	bad[len(bad)-1] ^= 1
	if err := st3.ReplaceSecret(ctx, caKeySecret, v, bad); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, st3, Config{KEK: ring, Log: quiet(), Now: time.Now}); !errors.Is(err, kek.ErrDecrypt) {
		t.Fatalf("start with an altered CA key: %v", err)
	}
}
