package integration

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// testKEK is the key-encryption key of every replica the tests start (one
// for the whole binary: replicas sharing a store need the same one).
var testKEKKey = sync.OnceValue(func() *kek.Key {
	k, err := kek.Generate()
	if err != nil {
		panic(err)
	}
	return k
})

func testKEK() *kek.Ring { return kek.NewRing(testKEKKey()) }

// rawPrivateKeys reads the stored CA key and signing keys with raw SQL,
// bypassing every accessor: what someone with a copy of the database sees.
func rawPrivateKeys(t *testing.T, st store.Store) map[string][]byte {
	t.Helper()
	db := st.(interface{ DB() sqlstore.DB }).DB()
	ctx := context.Background()
	out := map[string][]byte{}
	var v string
	if err := db.QueryRow(ctx, `SELECT value FROM secrets WHERE name = 'ca_key_pem'`).Scan(&v); err != nil {
		t.Fatalf("select CA key: %v", err)
	}
	out["ca_key_pem"] = unb64(t, v)
	rows, err := db.Query(ctx, `SELECT kid, private_key FROM signing_keys`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var kid, priv string
		if err := rows.Scan(&kid, &priv); err != nil {
			t.Fatal(err)
		}
		out["signing_key/"+kid] = unb64(t, priv)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) < 2 {
		t.Fatalf("private keys %v: want the CA key and a signing key", out)
	}
	return out
}

func unb64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// assertSealed: no stored value is a PEM block or parses as a private key.
func assertSealed(t *testing.T, keys map[string][]byte, kekID string) {
	t.Helper()
	for name, v := range keys {
		if blk, _ := pem.Decode(v); blk != nil || bytes.Contains(v, []byte("PRIVATE KEY")) {
			t.Errorf("%s is stored as PEM: %q", name, v)
		}
		if _, err := x509.ParsePKCS8PrivateKey(v); err == nil {
			t.Errorf("%s is stored as a parsable PKCS#8 key", name)
		}
		if _, err := x509.ParseECPrivateKey(v); err == nil {
			t.Errorf("%s is stored as a parsable EC key", name)
		}
		if id, ok := kek.KeyID(v); !ok || id != kekID {
			t.Errorf("%s sealed with %q (sealed %v), want key-encryption key %s", name, id, ok, kekID)
		}
	}
}

// TestPrivateKeysEncryptedAtRest: after a start with a KEK, the secrets
// and signing_keys rows are neither PEM nor parsable keys, on both stores;
// the public CA certificate stays readable.
func TestPrivateKeysEncryptedAtRest(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			st := b.open(t)
			e := startEnv(t, st)
			e.op("POST", "/api/v1/signing-keys/rotate", nil, nil) // a second, rotated key
			keys := rawPrivateKeys(t, st)
			if len(keys) < 3 {
				t.Fatalf("want the CA key and two signing keys, got %d rows", len(keys))
			}
			assertSealed(t, keys, testKEK().PrimaryID())
			cert, err := st.GetSecret(context.Background(), "ca_cert_pem")
			if err != nil || !bytes.Equal(cert, e.srv.CAPEM()) {
				t.Fatalf("CA certificate row %q, %v: want the public PEM", cert, err)
			}
			// The replica still works: a host enrols, i.e. the CA key signs.
			e.enroll("node-k", e.createHost("node-k").Token)
		})
	}
}

// TestKEKRequiredToStart: a store whose keys are sealed does not start
// without its KEK or with another one; with none at all New refuses unless
// plaintext keys are explicitly allowed.
func TestKEKRequiredToStart(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	if _, err := server.New(ctx, server.Config{Logger: testLogger(t)}, st); !errors.Is(err, server.ErrNoKEK) ||
		!strings.Contains(err.Error(), "--kek-file") || !strings.Contains(err.Error(), "--insecure-plaintext-keys") {
		t.Fatalf("fresh store without a KEK: %v, want ErrNoKEK naming both flags", err)
	}
	if _, err := server.New(ctx, server.Config{Logger: testLogger(t), KEK: testKEK()}, st); err != nil {
		t.Fatal(err)
	}
	other, _ := kek.Generate()
	for name, cfg := range map[string]server.Config{
		"wrong KEK":          {KEK: kek.NewRing(other)},
		"no KEK":             {},
		"plaintext insisted": {InsecurePlaintextKeys: true},
	} {
		cfg.Logger = testLogger(t)
		_, err := server.New(ctx, cfg, st)
		want := server.ErrKEKMismatch
		if name == "no KEK" {
			want = server.ErrNoKEK
		}
		if !errors.Is(err, want) || !strings.Contains(err.Error(), "--kek-file") {
			t.Errorf("%s: %v, want %v naming --kek-file", name, err, want)
		}
	}
	// The refused starts changed nothing.
	assertSealed(t, rawPrivateKeys(t, st), testKEK().PrimaryID())
}

// TestPlaintextKeysEncryptedInPlace: keys written in plaintext (before
// encryption at rest, or under --insecure-plaintext-keys) are encrypted on
// the first start with a KEK and stay the same keys: same CA, same kids.
func TestPlaintextKeysEncryptedInPlace(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			st := b.open(t)
			legacy, err := server.New(ctx, server.Config{Logger: testLogger(t), InsecurePlaintextKeys: true}, st)
			if err != nil {
				t.Fatal(err)
			}
			before := rawPrivateKeys(t, st)
			if blk, _ := pem.Decode(before["ca_key_pem"]); blk == nil {
				t.Fatalf("legacy CA key row is not plaintext PEM: %q", before["ca_key_pem"])
			}
			e := startEnv(t, st)
			after := rawPrivateKeys(t, st)
			assertSealed(t, after, testKEK().PrimaryID())
			if e.srv.CAHash() != legacy.CAHash() {
				t.Fatal("the CA changed while its key was encrypted")
			}
			for name := range before {
				if _, ok := after[name]; !ok {
					t.Errorf("%s vanished", name)
				}
			}
			// A second start re-encrypts nothing.
			n, err := server.SealAtRest(ctx, st, testKEK(), testLogger(t))
			if err != nil || n != 0 {
				t.Fatalf("SealAtRest on an encrypted store: %d, %v", n, err)
			}
			e.enroll("node-l", e.createHost("node-l").Token)
		})
	}
}

// TestKEKRotation: SealAtRest with a new primary and the old KEK as a
// previous one re-seals every key; afterwards only the new KEK starts it.
func TestKEKRotation(t *testing.T) {
	ctx := context.Background()
	st := openSQLite(t)
	old := testKEK()
	first, err := server.New(ctx, server.Config{Logger: testLogger(t), KEK: old}, st)
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := kek.Generate()
	ring := kek.NewRing(fresh, testKEKKey())
	n, err := server.SealAtRest(ctx, st, ring, testLogger(t))
	if err != nil || n < 2 {
		t.Fatalf("rotation re-sealed %d keys, %v", n, err)
	}
	assertSealed(t, rawPrivateKeys(t, st), fresh.ID())
	if _, err := server.New(ctx, server.Config{Logger: testLogger(t), KEK: old}, st); !errors.Is(err, server.ErrKEKMismatch) {
		t.Fatalf("start with the old KEK after rotation: %v", err)
	}
	srv, err := server.New(ctx, server.Config{Logger: testLogger(t), KEK: kek.NewRing(fresh)}, st)
	if err != nil || srv.CAHash() != first.CAHash() {
		t.Fatalf("start with the new KEK: %v (same CA: %v)", err, srv != nil && srv.CAHash() == first.CAHash())
	}
}
