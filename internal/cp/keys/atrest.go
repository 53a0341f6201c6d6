package keys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/store"
)

// Names of the private keys the store holds. The CA certificate
// (ca_cert_pem) is public and stays in clear.
const caKeySecret = "ca_key_pem"

// privateSecrets are the secrets-table rows sealed with the KEK.
func privateSecrets() []string { return []string{caKeySecret} }

// signingKeyName is a task-signing key's name as associated data.
func signingKeyName(kid string) string { return "signing_key/" + kid }

// Errors New returns when the private keys cannot be used.
var (
	// ErrNoKEK: no key-encryption key and plaintext keys not allowed.
	ErrNoKEK = errors.New("no key-encryption key: give --kek-file (or DROVER_KEK_FILE, or the systemd " +
		"credential drover-kek) so private keys are encrypted at rest, or --insecure-plaintext-keys to store them in plaintext")
	// ErrKEKMismatch: a private key is sealed with a KEK that is not
	// configured, or none is configured.
	ErrKEKMismatch = errors.New("wrong or missing --kek-file")
)

// atRest seals and opens the private keys the store holds; a nil ring
// keeps them in plaintext (InsecurePlaintextKeys).
type atRest struct{ ring *kek.Ring }

func (a atRest) seal(name string, plain []byte) ([]byte, error) {
	if a.ring == nil {
		return plain, nil
	}
	return a.ring.Seal(name, plain)
}

// open returns the plaintext of a stored private key. With a KEK
// configured, a plaintext row is refused: New encrypts every one it finds,
// so one appearing later was not written by a replica with the KEK.
func (a atRest) open(name string, stored []byte) ([]byte, error) {
	id, sealed := kek.KeyID(stored)
	switch {
	case a.ring == nil && sealed:
		return nil, fmt.Errorf("%s is encrypted at rest with key-encryption key %s but none is configured: %w", name, id, ErrKEKMismatch)
	case a.ring == nil:
		return stored, nil
	case !sealed:
		return nil, fmt.Errorf("%s is stored in plaintext although a key-encryption key is configured; restart a replica with the key-encryption key to encrypt it", name)
	}
	plain, err := a.ring.Open(name, stored)
	switch {
	case errors.Is(err, kek.ErrUnknownKey):
		return nil, fmt.Errorf("%s is encrypted with key-encryption key %s, not with the configured %s: %w",
			name, id, a.ring.PrimaryID(), ErrKEKMismatch)
	case err != nil:
		return nil, fmt.Errorf("%s does not decrypt with key-encryption key %s (damaged or altered in the database): %w", name, id, err)
	}
	return plain, nil
}

// SealAtRest encrypts every private key in st that is not sealed with the
// ring's primary KEK: rows in plaintext (written before encryption at rest
// or under --insecure-plaintext-keys) and rows sealed with a previous KEK of
// the ring (a KEK rotation). Rows already sealed with the primary are
// checked to open. Each row is replaced only if it is unchanged since it was
// read, so replicas doing this at once do not overwrite each other. It
// returns how many rows it rewrote; New runs it on every start with a KEK,
// `drover keys rotate-kek` runs it offline.
func SealAtRest(ctx context.Context, st Store, ring *kek.Ring, log *slog.Logger) (int, error) {
	rest := atRest{ring: ring}
	n := 0
	reseal := func(name string, stored []byte, replace func(sealed []byte) error) error {
		var plain []byte
		from := "plaintext"
		if id, ok := kek.KeyID(stored); ok {
			p, err := rest.open(name, stored)
			if err != nil {
				return err
			}
			if id == ring.PrimaryID() {
				return nil
			}
			plain, from = p, "key-encryption key "+id
		} else {
			plain = stored
		}
		sealed, err := ring.Seal(name, plain)
		if err != nil {
			return err
		}
		switch err := replace(sealed); {
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			// Another replica rewrote or removed it meanwhile; loading checks it.
			log.Info("private key changed while encrypting it at rest; left to the other writer", "name", name)
			return nil
		case err != nil:
			return err
		}
		n++
		log.Info("encrypted private key at rest", "name", name, "kek_id", ring.PrimaryID(), "was", from)
		return nil
	}
	for _, name := range privateSecrets() {
		v, err := st.GetSecret(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			continue
		} else if err != nil {
			return n, fmt.Errorf("read %s: %w", name, err)
		}
		if err := reseal(name, v, func(sealed []byte) error { return st.ReplaceSecret(ctx, name, v, sealed) }); err != nil {
			return n, fmt.Errorf("encrypt %s at rest: %w", name, err)
		}
	}
	keys, err := st.ListSigningKeys(ctx)
	if err != nil {
		return n, fmt.Errorf("list signing keys: %w", err)
	}
	for _, k := range keys {
		err := reseal(signingKeyName(k.KID), k.PrivateKey, func(sealed []byte) error {
			return st.ReplaceSigningKey(ctx, k.KID, k.PrivateKey, sealed)
		})
		if err != nil {
			return n, fmt.Errorf("encrypt signing key %s at rest: %w", k.KID, err)
		}
	}
	if n > 0 {
		log.Warn("private keys encrypted in place with the key-encryption key; keep it: without it this store's CA and signing keys are lost",
			"rewritten", n, "kek_id", ring.PrimaryID())
	}
	return n, nil
}
