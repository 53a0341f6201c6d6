package kek

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func mustKey(t *testing.T) (*Key, []byte) {
	t.Helper()
	raw := bytes.Repeat([]byte{7}, Size)
	k, err := New(raw)
	if err != nil {
		t.Fatal(err)
	}
	return k, raw
}

func TestSealOpen(t *testing.T) {
	k, _ := mustKey(t)
	r := NewRing(k)
	secret := []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	sealed, err := r.Seal("ca_key_pem", secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("PRIVATE KEY")) || !IsSealed(sealed) {
		t.Fatalf("sealed value %q leaks the plaintext or lacks the header", sealed)
	}
	if id, _ := KeyID(sealed); id != k.ID() {
		t.Fatalf("key id %q, want %q", id, k.ID())
	}
	got, err := r.Open("ca_key_pem", sealed)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	again, _ := r.Seal("ca_key_pem", secret)
	if bytes.Equal(again, sealed) {
		t.Fatal("two seals of one value are identical (nonce reuse)")
	}
	// The name is bound: a value moved to another row does not open.
	if _, err := r.Open("signing_key/x", sealed); !errors.Is(err, ErrDecrypt) {
		t.Fatalf("open under another name: %v, want ErrDecrypt", err)
	}
	// A flipped bit does not open.
	bad := append([]byte(nil), sealed...)
	bad[len(bad)-1] ^= 1
	if _, err := r.Open("ca_key_pem", bad); !errors.Is(err, ErrDecrypt) {
		t.Fatalf("open tampered: %v, want ErrDecrypt", err)
	}
	if _, err := r.Open("ca_key_pem", sealed[:hdrLen+3]); !errors.Is(err, ErrDecrypt) {
		t.Fatalf("open truncated: %v, want ErrDecrypt", err)
	}
	if _, err := r.Open("ca_key_pem", secret); err == nil || IsSealed(secret) {
		t.Fatal("plaintext opened as a sealed value")
	}
}

func TestWrongAndPreviousKeys(t *testing.T) {
	old, _ := mustKey(t)
	fresh, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID() == old.ID() {
		t.Fatal("two keys share an id")
	}
	sealed, _ := NewRing(old).Seal("n", []byte("v"))
	if _, err := NewRing(fresh).Open("n", sealed); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("open with a wrong KEK: %v, want ErrUnknownKey", err)
	}
	both := NewRing(fresh, old)
	if got, err := both.Open("n", sealed); err != nil || string(got) != "v" {
		t.Fatalf("open with the previous KEK: %q, %v", got, err)
	}
	resealed, _ := both.Seal("n", []byte("v"))
	if id, _ := KeyID(resealed); id != fresh.ID() || both.PrimaryID() != fresh.ID() {
		t.Fatalf("sealed with %s, want the primary %s", id, fresh.ID())
	}
}

func TestParseForms(t *testing.T) {
	k, raw := mustKey(t)
	for name, in := range map[string][]byte{
		"raw":    raw,
		"hex":    []byte(hex.EncodeToString(raw) + "\n"),
		"base64": []byte(" " + base64.StdEncoding.EncodeToString(raw) + "\n"),
	} {
		got, err := Parse(in)
		if err != nil || got.ID() != k.ID() {
			t.Errorf("%s: %v, id %v", name, err, got)
		}
	}
	for _, in := range [][]byte{nil, []byte("short"), bytes.Repeat([]byte{1}, Size+1)} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}

func TestCreateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kek")
	k1, err := EnsureFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != Size {
		t.Fatalf("kek file %v: mode %v size %d", err, fi.Mode(), fi.Size())
	}
	k2, err := EnsureFile(path)
	if err != nil || k2.ID() != k1.ID() {
		t.Fatalf("second EnsureFile: %v, id changed %v", err, k2 == nil || k2.ID() != k1.ID())
	}
	if err := CreateFile(path); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("CreateFile over an existing file: %v", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, insecure, err := LoadFile(path); err != nil || !insecure {
		t.Fatalf("LoadFile of a 0644 file: insecure=%v, %v", insecure, err)
	}
	if _, _, err := LoadFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing file loaded")
	}
}
