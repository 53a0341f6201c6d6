package task

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Envelope constants.
const (
	// EnvelopeType is the JWS "typ" header of every task envelope.
	EnvelopeType = "drover-task+jws"
	// MaxFutureIssuedAt is how far in the future iat may be (clock skew
	// between control plane and node). exp gets no skew allowance.
	MaxFutureIssuedAt = 5 * time.Minute
	// MaxEnvelopeLen bounds the compact serialization Verify accepts.
	MaxEnvelopeLen = 1 << 20
)

// Sentinel errors. Verify and CheckDelivery wrap exactly one of them with
// context; Code maps them to stable result codes.
var (
	ErrMalformed        = errors.New("task envelope malformed")
	ErrAlgorithm        = errors.New("task envelope algorithm rejected")
	ErrUnknownKey       = errors.New("task envelope signed by unknown key")
	ErrSignature        = errors.New("task envelope signature invalid")
	ErrWrongNode        = errors.New("task envelope addressed to another node")
	ErrExpired          = errors.New("task envelope outside its validity window")
	ErrDeliveryMismatch = errors.New("task delivery does not match its envelope")
)

// Code maps an error from Verify or CheckDelivery to a stable result code:
// envelope_malformed, envelope_algorithm_rejected, envelope_unknown_kid,
// envelope_bad_signature, envelope_wrong_node, envelope_expired,
// envelope_delivery_mismatch. nil maps to "", any other error to
// "envelope_invalid".
func Code(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrMalformed):
		return "envelope_malformed"
	case errors.Is(err, ErrAlgorithm):
		return "envelope_algorithm_rejected"
	case errors.Is(err, ErrUnknownKey):
		return "envelope_unknown_kid"
	case errors.Is(err, ErrSignature):
		return "envelope_bad_signature"
	case errors.Is(err, ErrWrongNode):
		return "envelope_wrong_node"
	case errors.Is(err, ErrExpired):
		return "envelope_expired"
	case errors.Is(err, ErrDeliveryMismatch):
		return "envelope_delivery_mismatch"
	}
	return "envelope_invalid"
}

func fail(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// KeyID returns the kid Drover uses for pub: the first 16 hex digits of
// sha256(pub).
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// GenerateKey creates a task-signing key; kid is KeyID of its public key.
func GenerateKey() (kid string, key ed25519.PrivateKey, err error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", nil, fmt.Errorf("task: generate signing key: %w", err)
	}
	return KeyID(pub), key, nil
}

// PublicJWK describes pub as a JWK: kty OKP, crv Ed25519, alg EdDSA, use sig.
func PublicJWK(kid string, pub ed25519.PublicKey) api.JWK {
	return api.JWK{
		Kty: "OKP",
		Crv: "Ed25519",
		X:   base64.RawURLEncoding.EncodeToString(pub),
		Kid: kid,
		Alg: string(jose.EdDSA),
		Use: "sig",
	}
}

// Signer signs task claims. It is immutable and safe for concurrent use.
type Signer struct {
	kid string
	key ed25519.PrivateKey
}

// NewSigner returns a signer for key, announcing kid in every envelope.
func NewSigner(kid string, key ed25519.PrivateKey) *Signer {
	return &Signer{kid: kid, key: bytes.Clone(key)}
}

// KeyID returns the signer's kid.
func (s *Signer) KeyID() string { return s.kid }

// PublicJWK returns the signer's public key as a JWK.
func (s *Signer) PublicJWK() api.JWK {
	return PublicJWK(s.kid, s.key.Public().(ed25519.PublicKey))
}

// Sign returns c as a compact JWS with protected header
// {"alg":"EdDSA","kid":<kid>,"typ":"drover-task+jws"}. It refuses claims
// that Verify would reject as incomplete (empty task_id, type or aud; iat
// unset; exp not after iat).
func (s *Signer) Sign(c api.TaskClaims) (string, error) {
	if len(s.key) != ed25519.PrivateKeySize || s.kid == "" {
		return "", errors.New("task: signer needs a kid and an Ed25519 private key")
	}
	switch {
	case c.TaskID == "" || c.Type == "" || c.NodeID == "":
		return "", errors.New("task: claims need task_id, type and aud")
	case c.IssuedAt <= 0 || c.ExpiresAt <= c.IssuedAt:
		return "", fmt.Errorf("task: claims need iat > 0 and exp > iat (iat=%d exp=%d)", c.IssuedAt, c.ExpiresAt)
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("task: marshal claims: %w", err)
	}
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.EdDSA, Key: jose.JSONWebKey{Key: s.key, KeyID: s.kid}},
		(&jose.SignerOptions{}).WithType(EnvelopeType),
	)
	if err != nil {
		return "", fmt.Errorf("task: signer: %w", err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("task: sign: %w", err)
	}
	return jws.CompactSerialize()
}

// Verifier verifies task envelopes against a JWKS. It is safe for concurrent
// use; SetKeys replaces the key set (rotation).
type Verifier struct {
	mu   sync.RWMutex
	keys map[string]ed25519.PublicKey
}

// NewVerifier returns a verifier for jwks (see SetKeys for the rules).
func NewVerifier(jwks api.JWKS) (*Verifier, error) {
	v := &Verifier{}
	if err := v.SetKeys(jwks); err != nil {
		return nil, err
	}
	return v, nil
}

// SetKeys replaces the key set. Every key must be kty OKP, crv Ed25519, alg
// EdDSA, use "sig" or empty, with a non-empty unique kid and a 32-byte x. An
// empty set is rejected, so a bad refresh cannot wipe the keys. On error the
// previous keys stay in place.
func (v *Verifier) SetKeys(jwks api.JWKS) error {
	if len(jwks.Keys) == 0 {
		return errors.New("task: JWKS has no keys")
	}
	keys := make(map[string]ed25519.PublicKey, len(jwks.Keys))
	for i, k := range jwks.Keys {
		switch {
		case k.Kid == "":
			return fmt.Errorf("task: JWKS key %d: empty kid", i)
		case k.Kty != "OKP" || k.Crv != "Ed25519":
			return fmt.Errorf("task: JWKS key %q: want kty OKP crv Ed25519, got %q %q", k.Kid, k.Kty, k.Crv)
		case k.Alg != string(jose.EdDSA):
			return fmt.Errorf("task: JWKS key %q: want alg EdDSA, got %q", k.Kid, k.Alg)
		case k.Use != "" && k.Use != "sig":
			return fmt.Errorf("task: JWKS key %q: want use sig, got %q", k.Kid, k.Use)
		}
		x, err := base64.RawURLEncoding.DecodeString(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return fmt.Errorf("task: JWKS key %q: x must be a base64url 32-byte Ed25519 key", k.Kid)
		}
		if _, dup := keys[k.Kid]; dup {
			return fmt.Errorf("task: JWKS has duplicate kid %q", k.Kid)
		}
		keys[k.Kid] = ed25519.PublicKey(x)
	}
	v.mu.Lock()
	v.keys = keys
	v.mu.Unlock()
	return nil
}

func (v *Verifier) key(kid string) (ed25519.PublicKey, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	k, ok := v.keys[kid]
	return k, ok
}

// Verify checks a compact task envelope for nodeID at time now and returns
// its claims. In order: the envelope must be at most MaxEnvelopeLen bytes in
// three canonical base64url segments and parse with EdDSA as the only allowed
// algorithm (ErrMalformed, ErrAlgorithm) and carry typ drover-task+jws; its
// kid must be in the key set (ErrUnknownKey: refresh the JWKS once and
// retry); the signature must verify (ErrSignature); the claims must decode
// strictly with non-empty task_id and type and exp > iat (ErrMalformed); aud
// must equal nodeID (ErrWrongNode); now must be before exp, with no skew, and
// iat no more than MaxFutureIssuedAt ahead of now (ErrExpired).
func (v *Verifier) Verify(compact, nodeID string, now time.Time) (api.TaskClaims, error) {
	if len(compact) > MaxEnvelopeLen {
		return api.TaskClaims{}, fail(ErrMalformed, "envelope is %d bytes, limit %d", len(compact), MaxEnvelopeLen)
	}
	if err := checkCompactShape(compact); err != nil {
		return api.TaskClaims{}, err
	}
	jws, err := jose.ParseSignedCompact(compact, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		var algErr *jose.ErrUnexpectedSignatureAlgorithm
		if errors.As(err, &algErr) {
			return api.TaskClaims{}, fail(ErrAlgorithm, "alg %q not allowed; want EdDSA", algErr.Got)
		}
		return api.TaskClaims{}, fail(ErrMalformed, "%v", err)
	}
	if len(jws.Signatures) != 1 {
		return api.TaskClaims{}, fail(ErrMalformed, "want exactly one signature, got %d", len(jws.Signatures))
	}
	hdr := jws.Signatures[0].Protected
	if hdr.Algorithm != string(jose.EdDSA) {
		return api.TaskClaims{}, fail(ErrAlgorithm, "protected alg %q not allowed; want EdDSA", hdr.Algorithm)
	}
	if typ, _ := hdr.ExtraHeaders[jose.HeaderType].(string); typ != EnvelopeType {
		return api.TaskClaims{}, fail(ErrMalformed, "typ %q, want %q", typ, EnvelopeType)
	}
	if hdr.KeyID == "" {
		return api.TaskClaims{}, fail(ErrUnknownKey, "no kid in protected header")
	}
	pub, ok := v.key(hdr.KeyID)
	if !ok {
		return api.TaskClaims{}, fail(ErrUnknownKey, "kid %q", hdr.KeyID)
	}
	payload, err := jws.Verify(pub)
	if err != nil {
		if errors.Is(err, jose.ErrCryptoFailure) {
			return api.TaskClaims{}, fail(ErrSignature, "kid %q", hdr.KeyID)
		}
		return api.TaskClaims{}, fail(ErrMalformed, "%v", err)
	}
	c, err := decodeClaims(payload)
	if err != nil {
		return api.TaskClaims{}, err
	}
	if nodeID == "" || c.NodeID != nodeID {
		return api.TaskClaims{}, fail(ErrWrongNode, "aud %q, this node is %q", c.NodeID, nodeID)
	}
	if exp := time.Unix(c.ExpiresAt, 0); !now.Before(exp) {
		return api.TaskClaims{}, fail(ErrExpired, "expired at %s (now %s)", exp.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if iat := time.Unix(c.IssuedAt, 0); iat.After(now.Add(MaxFutureIssuedAt)) {
		return api.TaskClaims{}, fail(ErrExpired, "not yet valid: iat %s is more than %s after now %s",
			iat.UTC().Format(time.RFC3339), MaxFutureIssuedAt, now.UTC().Format(time.RFC3339))
	}
	return c, nil
}

// checkCompactShape requires exactly three dot-separated segments, each in
// canonical unpadded base64url, so that one token has exactly one spelling
// (encoding/base64 would otherwise skip newlines and ignore trailing bits).
func checkCompactShape(compact string) error {
	segs := strings.Split(compact, ".")
	if len(segs) != 3 {
		return fail(ErrMalformed, "compact JWS must have 3 segments, got %d", len(segs))
	}
	for i, seg := range segs {
		if seg == "" {
			return fail(ErrMalformed, "segment %d is empty", i)
		}
		b, err := base64.RawURLEncoding.Strict().DecodeString(seg)
		if err != nil || base64.RawURLEncoding.EncodeToString(b) != seg {
			return fail(ErrMalformed, "segment %d is not canonical base64url", i)
		}
	}
	return nil
}

// decodeClaims decodes verified claims strictly: one JSON object, no unknown
// fields, required fields present.
func decodeClaims(payload []byte) (api.TaskClaims, error) {
	var c api.TaskClaims
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return api.TaskClaims{}, fail(ErrMalformed, "claims: %v", err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return api.TaskClaims{}, fail(ErrMalformed, "claims: trailing data")
	}
	switch {
	case c.TaskID == "":
		return api.TaskClaims{}, fail(ErrMalformed, "claims: task_id is empty")
	case c.Type == "":
		return api.TaskClaims{}, fail(ErrMalformed, "claims: type is empty")
	case c.IssuedAt <= 0 || c.ExpiresAt <= c.IssuedAt:
		return api.TaskClaims{}, fail(ErrMalformed, "claims: need iat > 0 and exp > iat (iat=%d exp=%d)", c.IssuedAt, c.ExpiresAt)
	}
	return c, nil
}

// CheckDelivery checks that the unsigned outer fields of a delivery equal the
// signed claims (task_id, task_type, correlation_id, expires_at to the
// second); otherwise it returns ErrDeliveryMismatch naming the fields.
// Attempt is not signed and not checked.
func CheckDelivery(d api.TaskDelivery, c api.TaskClaims) error {
	var bad []string
	if d.TaskID != c.TaskID {
		bad = append(bad, fmt.Sprintf("task_id %q != %q", d.TaskID, c.TaskID))
	}
	if d.TaskType != c.Type {
		bad = append(bad, fmt.Sprintf("task_type %q != %q", d.TaskType, c.Type))
	}
	if d.CorrelationID != c.CorrelationID {
		bad = append(bad, fmt.Sprintf("correlation_id %q != %q", d.CorrelationID, c.CorrelationID))
	}
	if d.ExpiresAt.Unix() != c.ExpiresAt {
		bad = append(bad, fmt.Sprintf("expires_at %d != %d", d.ExpiresAt.Unix(), c.ExpiresAt))
	}
	if len(bad) > 0 {
		return fail(ErrDeliveryMismatch, "%v", bad)
	}
	return nil
}
