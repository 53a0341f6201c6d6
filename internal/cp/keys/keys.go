// Package keys owns the control plane's private keys: the built-in CA that
// signs node certificates and the Ed25519 keyring that signs tasks (rotation,
// the public JWKS, the node listener's TLS config and the keys that seal its
// session tickets, derived from the CA key), loaded from or created in the
// store through Open. Private keys are sealed at rest with the
// key-encryption key (internal/cp/kek); SealAtRest encrypts rows an earlier
// version stored in plaintext. It must not serve routes or decide who may
// use a key: the rooms that sign (tasks) or issue certificates (hosts) do.
package keys

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/periodic"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/task"
)

// retiredKeyGrace keeps a rotated-out signing key in the JWKS long enough
// for every task signed with it to expire.
const retiredKeyGrace = 48 * time.Hour

// loadOrCreateCA returns the CA shared by all replicas, creating it on the
// very first start (first writer wins), and its private key (PEM). The key
// is stored sealed by rest.
func loadOrCreateCA(ctx context.Context, st Store, now time.Time, rest atRest) (*pki.CA, []byte, error) {
	certPEM, keyPEM, err := pki.NewCA("Drover CA", now)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA: %w", err)
	}
	sealedKey, err := rest.seal(caKeySecret, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("encrypt CA key: %w", err)
	}
	certPEM, err = st.PutSecretIfAbsent(ctx, "ca_cert_pem", certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("store CA certificate: %w", err)
	}
	if sealedKey, err = st.PutSecretIfAbsent(ctx, caKeySecret, sealedKey); err != nil {
		return nil, nil, fmt.Errorf("store CA key: %w", err)
	}
	if keyPEM, err = rest.open(caKeySecret, sealedKey); err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	ca, err := pki.LoadCA(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("load CA: %w", err)
	}
	return ca, keyPEM, nil
}

// NodeTLSConfig is the node listener's TLS configuration: TLS 1.3, a
// server certificate of the CA for localhost, the listener's host (from
// nodeAddr) and hosts, and client certificates of the CA verified when
// given (each node route checks the caller's). Its session tickets are
// sealed with keys every replica derives from the CA (sessionTickets), so
// agents resume their TLS sessions across restarts and replicas.
func (k *Keys) NodeTLSConfig(nodeAddr string, hosts []string) (*tls.Config, error) {
	hosts = append([]string{"localhost", "127.0.0.1", "::1"}, hosts...)
	if h, _, err := net.SplitHostPort(nodeAddr); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	cert, err := k.ca.ServerCertificate(hosts, 365*24*time.Hour, k.now())
	if err != nil {
		return nil, fmt.Errorf("node listener certificate: %w", err)
	}
	return &tls.Config{
		MinVersion:    tls.VersionTLS13,
		Certificates:  []tls.Certificate{cert},
		ClientAuth:    tls.VerifyClientCertIfGiven,
		ClientCAs:     k.ca.Pool(),
		WrapSession:   k.tickets.wrap,
		UnwrapSession: k.tickets.unwrap,
	}, nil
}

// Store is what the keys room reads and writes: the secrets table (the
// CA) and the signing keys. store.Store satisfies it.
type Store interface {
	store.KeyStore
}

// Config configures the keys room.
type Config struct {
	// KEK seals the private keys at rest (see SealAtRest); nil refuses
	// (ErrNoKEK) unless InsecurePlaintextKeys.
	KEK                   *kek.Ring
	InsecurePlaintextKeys bool
	Now                   func() time.Time
	Log                   *slog.Logger
}

// Keys holds the CA and the task-signing keys: the newest active key
// signs, every active or recently retired key is published in the JWKS.
type Keys struct {
	st   Store
	now  func() time.Time
	log  *slog.Logger
	rest atRest
	ca   *pki.CA
	// tickets seals the node listener's session tickets.
	tickets *sessionTickets

	mu     sync.RWMutex
	signer *task.Signer
	kid    string
	jwks   api.JWKS
}

// Open loads (or, on first start, creates) the CA and the task-signing
// keys from st. With a KEK it first seals every private key at rest with
// it (SealAtRest); without one it refuses unless InsecurePlaintextKeys.
func Open(ctx context.Context, st Store, cfg Config) (*Keys, error) {
	rest := atRest{ring: cfg.KEK}
	if cfg.KEK == nil {
		if !cfg.InsecurePlaintextKeys {
			return nil, ErrNoKEK
		}
		cfg.Log.Warn("private keys are stored in plaintext (--insecure-plaintext-keys): anyone who can read the database can impersonate the control plane")
	} else if _, err := SealAtRest(ctx, st, cfg.KEK, cfg.Log); err != nil {
		return nil, err
	}
	ca, caKeyPEM, err := loadOrCreateCA(ctx, st, cfg.Now(), rest)
	if err != nil {
		return nil, err
	}
	tickets, err := newSessionTickets(caKeyPEM, cfg.Now)
	if err != nil {
		return nil, err
	}
	k := &Keys{st: st, now: cfg.Now, log: cfg.Log, rest: rest, ca: ca, tickets: tickets}
	if err := k.reload(ctx); err != nil {
		return nil, err
	}
	if k.signer == nil {
		first := func(kid string) []store.AuditEvent {
			return []store.AuditEvent{{At: cfg.Now().UTC(), Actor: "system", Action: "signing_key.create", Target: kid, Result: "ok",
				Detail: "the first task-signing key"}}
		}
		if _, err := k.Rotate(ctx, first); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// CA is the control plane's CA.
func (k *Keys) CA() *pki.CA { return k.ca }

// reload reads the keys from the store (another replica may have rotated).
func (k *Keys) reload(ctx context.Context) error {
	keys, err := k.st.ListSigningKeys(ctx)
	if err != nil {
		return fmt.Errorf("list signing keys: %w", err)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].CreatedAt.Before(keys[j].CreatedAt) })
	var (
		jwks   api.JWKS
		signer *task.Signer
		kid    string
	)
	now := k.now()
	for _, sk := range keys {
		if !sk.RetiredAt.IsZero() && now.Sub(sk.RetiredAt) > retiredKeyGrace {
			continue
		}
		der, err := k.rest.open(signingKeyName(sk.KID), sk.PrivateKey)
		if err != nil {
			return fmt.Errorf("signing key %s: %w", sk.KID, err)
		}
		parsed, err := x509.ParsePKCS8PrivateKey(der)
		if err != nil {
			return fmt.Errorf("signing key %s: %w", sk.KID, err)
		}
		priv, ok := parsed.(ed25519.PrivateKey)
		if !ok {
			return fmt.Errorf("signing key %s: not an Ed25519 key", sk.KID)
		}
		jwks.Keys = append(jwks.Keys, task.PublicJWK(sk.KID, priv.Public().(ed25519.PublicKey)))
		if sk.RetiredAt.IsZero() {
			signer, kid = task.NewSigner(sk.KID, priv), sk.KID // newest active wins
		}
	}
	k.mu.Lock()
	k.signer, k.kid, k.jwks = signer, kid, jwks
	k.mu.Unlock()
	return nil
}

// Rotate adds a new signing key, retires the others and returns its kid;
// audit (nil: none) gives the records stored with the rotation.
func (k *Keys) Rotate(ctx context.Context, audit func(kid string) []store.AuditEvent) (string, error) {
	kid, priv, err := task.GenerateKey()
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", err
	}
	if der, err = k.rest.seal(signingKeyName(kid), der); err != nil {
		return "", fmt.Errorf("encrypt signing key: %w", err)
	}
	var records []store.AuditEvent
	if audit != nil {
		records = audit(kid)
	}
	if err := k.st.RotateSigningKey(ctx, store.SigningKey{KID: kid, PrivateKey: der, CreatedAt: k.now()}, records...); err != nil {
		return "", err
	}
	return kid, k.reload(ctx)
}

// Sign signs task claims with the active key.
func (k *Keys) Sign(c api.TaskClaims) (string, error) {
	k.mu.RLock()
	signer := k.signer
	k.mu.RUnlock()
	if signer == nil {
		return "", errors.New("no active task-signing key")
	}
	return signer.Sign(c)
}

// SigningKID is the kid of the key that signs task envelopes now.
func (k *Keys) SigningKID() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.kid
}

// PublicSet is the JWKS nodes verify task envelopes with.
func (k *Keys) PublicSet() api.JWKS {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return api.JWKS{Keys: append([]api.JWK(nil), k.jwks.Keys...)}
}

// Run reloads the keys every 30s (another replica may rotate) until ctx
// ends.
func (k *Keys) Run(ctx context.Context) {
	periodic.Run(ctx, 30*time.Second, k.log, "reload signing keys", k.reload)
}
