package storetest

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
)

// keyCases cover in-place replacement of private keys (encryption at rest)
// and the claim's host gate.
var keyCases = []testCase{
	{"Secret/Replace", testReplaceSecret},
	{"Secret/ReplaceConcurrent", testReplaceSecretConcurrent},
	{"SigningKey/Replace", testReplaceSigningKey},
	{"Task/ClaimSkipsDisabledHost", testClaimSkipsDisabledHost},
}

func testReplaceSecret(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	plain := []byte("-----BEGIN PRIVATE KEY-----\x00\xff")
	_, err := s.PutSecretIfAbsent(ctx, "k", plain)
	must(t, err)
	sealed := []byte("sealed\x00\x01")
	wantErr(t, s.ReplaceSecret(ctx, "k", []byte("not the value"), sealed), store.ErrConflict)
	wantErr(t, s.ReplaceSecret(ctx, "absent", plain, sealed), store.ErrNotFound)
	must(t, s.ReplaceSecret(ctx, "k", plain, sealed))
	_, err = s.GetSecret(ctx, "absent")
	wantErr(t, err, store.ErrNotFound)
	got, err := s.GetSecret(ctx, "k")
	must(t, err)
	if !bytes.Equal(got, sealed) {
		t.Fatalf("secret after replace = %q, want %q", got, sealed)
	}
	// The old value no longer matches.
	wantErr(t, s.ReplaceSecret(ctx, "k", plain, []byte("again")), store.ErrConflict)
}

// testReplaceSecretConcurrent: of replicas replacing one value at once,
// exactly one wins.
func testReplaceSecretConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	_, err := s.PutSecretIfAbsent(ctx, "shared", []byte("plain"))
	must(t, err)
	const workers = 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins []byte
	)
	for i := range workers {
		wg.Go(func() {
			err := s.ReplaceSecret(ctx, "shared", []byte("plain"), []byte{byte(i)})
			if err == nil {
				mu.Lock()
				wins = append(wins, byte(i))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("%d replacements won, want 1", len(wins))
	}
	got, err := s.PutSecretIfAbsent(ctx, "shared", nil)
	must(t, err)
	if !bytes.Equal(got, wins) {
		t.Fatalf("stored %x, want the winner %x", got, wins)
	}
}

func testReplaceSigningKey(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	k := store.SigningKey{KID: "k1", PrivateKey: []byte("pkcs8\x00"), CreatedAt: at(0)}
	must(t, s.RotateSigningKey(ctx, k))
	wantErr(t, s.ReplaceSigningKey(ctx, "k1", []byte("other"), []byte("x")), store.ErrConflict)
	wantErr(t, s.ReplaceSigningKey(ctx, "k2", k.PrivateKey, []byte("x")), store.ErrNotFound)
	must(t, s.ReplaceSigningKey(ctx, "k1", k.PrivateKey, []byte("sealed\xff")))
	list, err := s.ListSigningKeys(ctx)
	must(t, err)
	k.PrivateKey = []byte("sealed\xff")
	diff(t, "keys after replace", list, []store.SigningKey{k})
}

// createOffAndGone creates host "off", disabled, and host "gone", revoked.
func createOffAndGone(t *testing.T, s store.Store) {
	t.Helper()
	off := newHost("off")
	off.Enabled = false
	createHost(t, s, off)
	gone := newHost("gone")
	gone.Revoked = true
	createHost(t, s, gone)
}

// testClaimSkipsDisabledHost: a disabled or revoked host's tasks stay
// queued; enabling the host makes them claimable. Tasks of node ids without
// a host record are claimable as before.
func testClaimSkipsDisabledHost(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	createOffAndGone(t, s)
	enqueue(t, s, newTask("t-off", "off", 0), newTask("t-gone", "gone", 0), newTask("t-none", "no-record", 0))
	for _, node := range []string{"off", "gone"} {
		if task, ok, err := s.ClaimTask(ctx, node, at(time.Second), at(time.Minute)); err != nil || ok {
			t.Fatalf("claim for %s host = %s, %v, %v; want nothing", node, task.ID, ok, err)
		}
	}
	if getTask(t, s, "t-off").State != "queued" {
		t.Fatal("disabled host's task left queued state")
	}
	claim(t, s, "no-record", time.Second, time.Minute)
	_, err := s.UpdateHost(ctx, "off", func(h *store.Host) error { h.Enabled = true; return nil })
	must(t, err)
	if task := claim(t, s, "off", 2*time.Second, time.Minute); task.ID != "t-off" {
		t.Fatalf("claimed %s after enable, want t-off", task.ID)
	}
}
