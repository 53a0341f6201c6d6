package server

import (
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

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
	if _, err := New(ctx, Config{KEK: ring, Logger: quiet()}, st); err != nil {
		t.Fatal(err)
	}
	keys, err := st.ListSigningKeys(ctx)
	if err != nil || len(keys) != 1 {
		t.Fatalf("signing keys %v, %v", keys, err)
	}
	kr := &keyring{st: st, now: time.Now, rest: atRest{ring: ring}}
	if err := kr.reload(ctx); err != nil {
		t.Fatalf("reload of the genuine key: %v", err)
	}

	// The CA key's sealed value copied into a signing-key row.
	caSealed, err := st.GetSecret(ctx, caKeySecret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.AddSigningKey(ctx, store.SigningKey{KID: "moved", PrivateKey: caSealed, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := kr.reload(ctx); err == nil || !errors.Is(err, kek.ErrDecrypt) {
		t.Fatalf("reload with a moved sealed value: %v, want a decryption failure", err)
	}

	// A planted plaintext key (the attacker's own) is refused.
	st2, _ := sqlite.Open(ctx, sqlite.MemoryPath)
	t.Cleanup(func() { st2.Close() })
	if _, err := New(ctx, Config{KEK: ring, Logger: quiet()}, st2); err != nil {
		t.Fatal(err)
	}
	kid, priv, _ := task.GenerateKey()
	der, _ := x509.MarshalPKCS8PrivateKey(priv)
	if err := st2.AddSigningKey(ctx, store.SigningKey{KID: kid, PrivateKey: der, CreatedAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	kr2 := &keyring{st: st2, now: time.Now, rest: atRest{ring: ring}}
	if err := kr2.reload(ctx); err == nil || !strings.Contains(err.Error(), "plaintext") {
		t.Fatalf("reload with a planted plaintext key: %v", err)
	}

	// A flipped bit in the CA key: the next start refuses.
	st3, _ := sqlite.Open(ctx, sqlite.MemoryPath)
	t.Cleanup(func() { st3.Close() })
	if _, err := New(ctx, Config{KEK: ring, Logger: quiet()}, st3); err != nil {
		t.Fatal(err)
	}
	v, _ := st3.GetSecret(ctx, caKeySecret)
	bad := append([]byte(nil), v...)
	bad[len(bad)-1] ^= 1
	if err := st3.ReplaceSecret(ctx, caKeySecret, v, bad); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctx, Config{KEK: ring, Logger: quiet()}, st3); !errors.Is(err, kek.ErrDecrypt) {
		t.Fatalf("start with an altered CA key: %v", err)
	}
}

func TestFailLimiter(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := newFailLimiter(rate.Every(10*time.Second), 2, func() time.Time { return now })
	if blocked, _ := l.blocked("src:a", "host:h"); blocked {
		t.Fatal("blocked before any failure")
	}
	l.fail("src:a", "host:h")
	if blocked, _ := l.blocked("src:a", "host:h"); blocked {
		t.Fatal("blocked after one failure of a burst of two")
	}
	l.fail("src:a", "host:h")
	blocked, after := l.blocked("src:b", "host:h")
	if !blocked || after != 10 {
		t.Fatalf("host h after two failures: blocked %v after %d, want blocked for 10s", blocked, after)
	}
	if blocked, _ := l.blocked("src:b", "host:other"); blocked {
		t.Fatal("an unrelated source and host are blocked")
	}
	l.fail("src:a", "host:h") // failing while blocked keeps it blocked, no debt beyond empty
	now = now.Add(10 * time.Second)
	if blocked, _ := l.blocked("src:a"); blocked {
		t.Fatal("still blocked after the refill interval")
	}
	// Full buckets are forgotten on the next sweep.
	now = now.Add(time.Hour)
	l.fail("src:z")
	l.mu.Lock()
	n := len(l.buckets)
	l.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d buckets after the sweep, want only src:z", n)
	}
}
