// Package kek encrypts the control plane's private keys at rest with a
// key-encryption key (KEK): AES-256-GCM from the standard library, the
// secret's name as associated data (a sealed value moved to another row does
// not open), and a version and key-id header so that several KEKs can be
// configured while one replaces another.
//
// A sealed value is
//
//	"drover-kek:v1:" <key id, 16 hex digits> ":" <12-byte nonce> <ciphertext and tag>
//
// and the associated data is the header followed by the secret's name. The
// key id is derived from the key (a truncated SHA-256 under a fixed label),
// so it names a KEK without revealing it and a wrong KEK is told apart from a
// damaged value.
package kek

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// Size is the length of a KEK in bytes (AES-256).
const Size = 32

const (
	magic   = "drover-kek:v1:"
	idLen   = 16 // hex digits
	hdrLen  = len(magic) + idLen + 1
	idLabel = "drover key-encryption key id v1\x00"
)

// Errors Open wraps; callers tell a missing KEK from a damaged value.
var (
	// ErrUnknownKey: the value was sealed with a KEK that is not in the ring.
	ErrUnknownKey = errors.New("sealed with a key-encryption key that is not configured")
	// ErrDecrypt: the KEK with the value's key id did not open it (the value
	// or its name was changed).
	ErrDecrypt = errors.New("decryption failed")
)

// Key is one KEK.
type Key struct {
	id   string
	aead cipher.AEAD
}

// New returns the KEK whose raw bytes are raw (Size bytes).
func New(raw []byte) (*Key, error) {
	if len(raw) != Size {
		return nil, fmt.Errorf("key-encryption key: %d bytes, want %d", len(raw), Size)
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("key-encryption key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("key-encryption key: %w", err)
	}
	sum := sha256.Sum256(append([]byte(idLabel), raw...))
	return &Key{id: hex.EncodeToString(sum[:idLen/2]), aead: aead}, nil
}

// Parse reads a KEK file's content: exactly Size raw bytes, or (surrounding
// white space ignored) 64 hex digits or the standard base64 of Size bytes.
func Parse(b []byte) (*Key, error) {
	if len(b) == Size {
		return New(b)
	}
	s := strings.TrimSpace(string(b))
	if raw, err := hex.DecodeString(s); err == nil && len(raw) == Size {
		return New(raw)
	}
	if raw, err := base64.StdEncoding.DecodeString(s); err == nil && len(raw) == Size {
		return New(raw)
	}
	return nil, fmt.Errorf("key-encryption key: want %d raw bytes, %d hex digits or base64 of %d bytes", Size, 2*Size, Size)
}

// LoadFile reads a KEK file (see Parse). insecureMode reports whether the
// file is readable or writable by group or others, for the caller to warn.
func LoadFile(path string) (k *Key, insecureMode bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false, fmt.Errorf("read key-encryption key: %w", err)
	}
	k, err = Parse(b)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, false, fmt.Errorf("read key-encryption key: %w", err)
	}
	return k, fi.Mode().Perm()&0o077 != 0, nil
}

// CreateFile writes a new random KEK (Size raw bytes, mode 0600) to path.
// It never overwrites: an existing file is fs.ErrExist.
func CreateFile(path string) error {
	raw := make([]byte, Size)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("generate key-encryption key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create key-encryption key: %w", err)
	}
	if _, err := f.Write(raw); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("write key-encryption key %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("write key-encryption key %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("write key-encryption key %s: %w", path, err)
	}
	return nil
}

// EnsureFile loads the KEK at path, creating it first when it is absent.
func EnsureFile(path string) (*Key, error) {
	if err := CreateFile(path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	k, _, err := LoadFile(path)
	return k, err
}

// Generate returns a new random KEK that exists only in memory.
func Generate() (*Key, error) {
	raw := make([]byte, Size)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("generate key-encryption key: %w", err)
	}
	return New(raw)
}

// ID is the KEK's key id (16 hex digits).
func (k *Key) ID() string { return k.id }

// Ring is the configured KEKs: the primary seals, every one opens.
type Ring struct {
	primary *Key
	keys    map[string]*Key
}

// NewRing returns a ring sealing with primary and also opening values
// sealed with any of previous.
func NewRing(primary *Key, previous ...*Key) *Ring {
	r := &Ring{primary: primary, keys: map[string]*Key{primary.id: primary}}
	for _, k := range previous {
		if _, ok := r.keys[k.id]; !ok {
			r.keys[k.id] = k
		}
	}
	return r
}

// PrimaryID is the key id new values are sealed with.
func (r *Ring) PrimaryID() string { return r.primary.id }

// Seal encrypts plaintext, bound to name, with the primary KEK.
func (r *Ring) Seal(name string, plaintext []byte) ([]byte, error) {
	k := r.primary
	hdr := []byte(magic + k.id + ":")
	nonce := make([]byte, k.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal %q: %w", name, err)
	}
	out := append(append(hdr, nonce...), k.aead.Seal(nil, nonce, plaintext, aad(hdr, name))...)
	return out, nil
}

// Open decrypts a value Seal produced for name with the KEK its header
// names: ErrUnknownKey when that KEK is not in the ring, ErrDecrypt when it
// does not open the value.
func (r *Ring) Open(name string, sealed []byte) ([]byte, error) {
	id, ok := KeyID(sealed)
	if !ok {
		return nil, fmt.Errorf("open %q: not a sealed value", name)
	}
	k := r.keys[id]
	if k == nil {
		return nil, fmt.Errorf("open %q: key id %s: %w", name, id, ErrUnknownKey)
	}
	hdr, body := sealed[:hdrLen], sealed[hdrLen:]
	ns := k.aead.NonceSize()
	if len(body) < ns+k.aead.Overhead() {
		return nil, fmt.Errorf("open %q: key id %s: %w (truncated)", name, id, ErrDecrypt)
	}
	pt, err := k.aead.Open(nil, body[:ns], body[ns:], aad(hdr, name))
	if err != nil {
		return nil, fmt.Errorf("open %q: key id %s: %w", name, id, ErrDecrypt)
	}
	return pt, nil
}

func aad(hdr []byte, name string) []byte {
	return append(append([]byte(nil), hdr...), name...)
}

// IsSealed reports whether b carries the sealed-value header.
func IsSealed(b []byte) bool {
	_, ok := KeyID(b)
	return ok
}

// KeyID returns the key id in a sealed value's header.
func KeyID(b []byte) (string, bool) {
	if len(b) < hdrLen || !bytes.HasPrefix(b, []byte(magic)) || b[hdrLen-1] != ':' {
		return "", false
	}
	id := string(b[len(magic) : hdrLen-1])
	if _, err := hex.DecodeString(id); err != nil {
		return "", false
	}
	return id, true
}
