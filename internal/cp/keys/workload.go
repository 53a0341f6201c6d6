package keys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/store"
)

// workloadSecretName is a workload secret's name as associated data: a
// prefix keeps the control plane's own keys (ca_key_pem, signing_key/...)
// and workload secrets apart, so a row copied from one table to the other,
// or to another name, does not open.
func workloadSecretName(name string) string { return "workload_secret/" + name }

// SealWorkloadSecret encrypts a workload secret's value with the primary
// KEK, bound to its name (the same sealing as the private keys). Without a
// KEK (--insecure-plaintext-keys) it refuses with ErrNoKEK: workload
// secrets are never stored in plaintext.
func (k *Keys) SealWorkloadSecret(name string, plain []byte) ([]byte, error) {
	if k.rest.ring == nil {
		return nil, fmt.Errorf("workload secret %q: %w", name, ErrNoKEK)
	}
	return k.rest.seal(workloadSecretName(name), plain)
}

// OpenWorkloadSecret decrypts a value SealWorkloadSecret produced for name
// with the KEK its header names (the primary or a previous one of the
// ring).
func (k *Keys) OpenWorkloadSecret(name string, sealed []byte) ([]byte, error) {
	if k.rest.ring == nil {
		return nil, fmt.Errorf("workload secret %q: %w", name, ErrNoKEK)
	}
	return k.rest.open(workloadSecretName(name), sealed)
}

// WorkloadSecretStore is what SealWorkloadSecrets reads and rewrites;
// store.Store is one.
type WorkloadSecretStore interface {
	ListWorkloadSecrets(ctx context.Context) ([]store.WorkloadSecret, error)
	GetWorkloadSecret(ctx context.Context, name string) (store.WorkloadSecret, error)
	ReplaceWorkloadSecret(ctx context.Context, name string, old, value []byte) error
}

// SealWorkloadSecrets seals again with ring's primary KEK every workload
// secret sealed with a previous KEK of the ring (a KEK rotation), as
// SealAtRest does for the private keys: each row is opened, sealed anew
// and replaced only if unchanged since it was read (an operator's write
// meanwhile wins; it is sealed with the primary already). A row that does
// not open is left as it is and named in the error returned once every
// other row is done (errors.Join; ErrKEKMismatch when its KEK is not in
// the ring). It returns how many rows it rewrote; the control plane runs it on every
// start with a KEK, `drover keys rotate-kek` runs it offline, after which
// the old KEK opens none of them.
func SealWorkloadSecrets(ctx context.Context, st WorkloadSecretStore, ring *kek.Ring, log *slog.Logger) (int, error) {
	list, err := st.ListWorkloadSecrets(ctx)
	if err != nil {
		return 0, fmt.Errorf("list workload secrets: %w", err)
	}
	rest := atRest{ring: ring}
	n := 0
	var unopened []error
	for _, meta := range list {
		ws, err := st.GetWorkloadSecret(ctx, meta.Name)
		if errors.Is(err, store.ErrNotFound) {
			continue // deleted meanwhile
		} else if err != nil {
			return n, fmt.Errorf("read workload secret %q: %w", meta.Name, err)
		}
		ad := workloadSecretName(ws.Name)
		id, _ := kek.KeyID(ws.Value)
		plain, err := rest.open(ad, ws.Value)
		if err != nil {
			unopened = append(unopened, fmt.Errorf("workload secret %q: %w", ws.Name, err))
			continue
		}
		if id == ring.PrimaryID() {
			continue
		}
		sealed, err := ring.Seal(ad, plain)
		clear(plain)
		if err != nil {
			return n, fmt.Errorf("workload secret %q: %w", ws.Name, err)
		}
		switch err := st.ReplaceWorkloadSecret(ctx, ws.Name, ws.Value, sealed); {
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			log.Info("workload secret changed while sealing it again; left to the other writer", "name", ws.Name)
			continue
		case err != nil:
			return n, err
		}
		n++
		log.Info("workload secret sealed with the new key-encryption key", "name", ws.Name, "kek_id", ring.PrimaryID(), "was", id)
	}
	return n, errors.Join(unopened...)
}
