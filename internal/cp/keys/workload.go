package keys

import (
	"fmt"
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
