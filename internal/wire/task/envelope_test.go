package task

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

var b64 = base64.RawURLEncoding

type testKey struct {
	kid string
	key ed25519.PrivateKey
}

func newTestKey(t testing.TB) testKey {
	t.Helper()
	kid, key, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return testKey{kid, key}
}

func (k testKey) pub() ed25519.PublicKey { return k.key.Public().(ed25519.PublicKey) }
func (k testKey) jwk() api.JWK           { return PublicJWK(k.kid, k.pub()) }

func testClaims(now time.Time) api.TaskClaims {
	return api.TaskClaims{
		TaskID:        "task-1",
		NodeID:        "node-1",
		Type:          TypeHealthProbe,
		Params:        json.RawMessage(`{"diagnostic_path":"/var/lib/x"}`),
		CorrelationID: "corr-1",
		IssuedAt:      now.Unix(),
		ExpiresAt:     now.Add(10 * time.Minute).Unix(),
	}
}

func mustSign(t testing.TB, k testKey, c api.TaskClaims) string {
	t.Helper()
	s, err := NewSigner(k.kid, k.key).Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signRaw builds a compact EdDSA JWS over arbitrary header and payload, as an
// attacker holding (or not holding) the key could.
func signRaw(key ed25519.PrivateKey, header map[string]any, payload []byte) string {
	h, _ := json.Marshal(header)
	input := b64.EncodeToString(h) + "." + b64.EncodeToString(payload)
	return input + "." + b64.EncodeToString(ed25519.Sign(key, []byte(input)))
}

func hdr(kid string) map[string]any {
	return map[string]any{"alg": "EdDSA", "kid": kid, "typ": EnvelopeType}
}

func claimsJSON(t testing.TB, c api.TaskClaims, drop ...string) []byte {
	t.Helper()
	b, _ := json.Marshal(c)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	for _, d := range drop {
		delete(m, d)
	}
	b, _ = json.Marshal(m)
	return b
}

func segments(tok string) []string { return strings.Split(tok, ".") }

func mustB64(t testing.TB, s string) []byte {
	t.Helper()
	b, err := b64.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func flip(b []byte, i int) []byte {
	b[i] ^= 0x01
	return b
}

// nextB64 returns the base64url character after c, so that the last
// character of a segment changes only bits that decoding ignores.
func nextB64(c string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.Index(alphabet, c)
	return string(alphabet[(i+1)%64])
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_900_000_000, 0)
	k := newTestKey(t)
	attacker := newTestKey(t)
	v, err := NewVerifier(api.JWKS{Keys: []api.JWK{k.jwk()}})
	if err != nil {
		t.Fatal(err)
	}
	c := testClaims(now)
	valid := mustSign(t, k, c)
	seg := segments(valid)

	tamperedPayload := func() string {
		p, _ := b64.DecodeString(seg[1])
		p[len(p)/2] ^= 0x01
		return seg[0] + "." + b64.EncodeToString(p) + "." + seg[2]
	}()
	payloadWithoutExp := seg[0] + "." + b64.EncodeToString(claimsJSON(t, c, "exp")) + "." + seg[2]
	hs256 := func(alg string) string {
		h, _ := json.Marshal(map[string]any{"alg": alg, "kid": k.kid, "typ": EnvelopeType})
		input := b64.EncodeToString(h) + "." + seg[1]
		mac := hmac.New(sha256.New, k.pub()) // classic confusion: public key as HMAC secret
		mac.Write([]byte(input))
		return input + "." + b64.EncodeToString(mac.Sum(nil))
	}
	none := func(alg string) string {
		h, _ := json.Marshal(map[string]any{"alg": alg, "kid": k.kid, "typ": EnvelopeType})
		return b64.EncodeToString(h) + "." + seg[1] + "."
	}
	withClaims := func(f func(*api.TaskClaims)) api.TaskClaims {
		cc := testClaims(now)
		f(&cc)
		return cc
	}
	resign := func(c api.TaskClaims, drop ...string) string {
		return signRaw(k.key, hdr(k.kid), claimsJSON(t, c, drop...))
	}

	tests := []struct {
		name    string
		token   string
		node    string
		at      time.Time
		wantErr error // nil → valid
	}{
		{"valid", valid, "node-1", now, nil},
		{"valid just before exp", valid, "node-1", time.Unix(c.ExpiresAt, 0).Add(-time.Nanosecond), nil},
		{"tampered payload byte", tamperedPayload, "node-1", now, ErrSignature},
		{"payload replaced with one lacking exp", payloadWithoutExp, "node-1", now, ErrSignature},
		{"signature by other key under our kid", signRaw(attacker.key, hdr(k.kid), claimsJSON(t, c)), "node-1", now, ErrSignature},
		{"signature truncated", seg[0] + "." + seg[1] + "." + b64.EncodeToString(mustB64(t, seg[2])[:61]), "node-1", now, ErrSignature},
		{"signature bit flipped", seg[0] + "." + seg[1] + "." + b64.EncodeToString(flip(mustB64(t, seg[2]), 10)), "node-1", now, ErrSignature},
		{"non-canonical trailing bits", seg[0] + "." + seg[1] + "." + seg[2][:len(seg[2])-1] + nextB64(seg[2][len(seg[2])-1:]), "node-1", now, ErrMalformed},
		{"re-signed without aud", resign(c, "aud"), "node-1", now, ErrWrongNode},
		{"re-signed without exp", resign(c, "exp"), "node-1", now, ErrMalformed},
		{"re-signed without iat", resign(c, "iat"), "node-1", now, ErrMalformed},
		{"re-signed without task_id", resign(c, "task_id"), "node-1", now, ErrMalformed},
		{"re-signed without type", resign(c, "type"), "node-1", now, ErrMalformed},
		{"re-signed with unknown claim", signRaw(k.key, hdr(k.kid), []byte(`{"task_id":"t","aud":"node-1","type":"x","iat":1900000000,"exp":1900000600,"admin":true}`)), "node-1", now, ErrMalformed},
		{"re-signed with trailing data", signRaw(k.key, hdr(k.kid), append(claimsJSON(t, c), []byte(`{}`)...)), "node-1", now, ErrMalformed},
		{"re-signed non-object payload", signRaw(k.key, hdr(k.kid), []byte(`[1]`)), "node-1", now, ErrMalformed},
		{"re-signed without typ", signRaw(k.key, map[string]any{"alg": "EdDSA", "kid": k.kid}, claimsJSON(t, c)), "node-1", now, ErrMalformed},
		{"re-signed with wrong typ", signRaw(k.key, map[string]any{"alg": "EdDSA", "kid": k.kid, "typ": "JWT"}, claimsJSON(t, c)), "node-1", now, ErrMalformed},
		{"unknown kid", mustSign(t, attacker, c), "node-1", now, ErrUnknownKey},
		{"no kid", signRaw(k.key, map[string]any{"alg": "EdDSA", "typ": EnvelopeType}, claimsJSON(t, c)), "node-1", now, ErrUnknownKey},
		{"embedded jwk ignored", signRaw(attacker.key, map[string]any{"alg": "EdDSA", "kid": k.kid, "typ": EnvelopeType, "jwk": attacker.jwk()}, claimsJSON(t, c)), "node-1", now, ErrSignature},
		{"alg HS256 with public key as secret", hs256("HS256"), "node-1", now, ErrAlgorithm},
		{"alg none", none("none"), "node-1", now, ErrMalformed}, // empty signature segment
		{"alg none with junk signature", none("none") + "AAAA", "node-1", now, ErrAlgorithm},
		{"alg None", none("None") + "AAAA", "node-1", now, ErrAlgorithm},
		{"alg RS256", none("RS256") + "AAAA", "node-1", now, ErrAlgorithm},
		{"alg ES256", none("ES256") + "AAAA", "node-1", now, ErrAlgorithm},
		{"alg missing", b64.EncodeToString([]byte(`{"kid":"`+k.kid+`"}`)) + "." + seg[1] + "." + seg[2], "node-1", now, ErrAlgorithm},
		{"expired at exp", valid, "node-1", time.Unix(c.ExpiresAt, 0), ErrExpired},
		{"expired by 1s (no skew on exp)", valid, "node-1", time.Unix(c.ExpiresAt+1, 0), ErrExpired},
		{"iat 4m in future", valid, "node-1", now.Add(-4 * time.Minute), nil},
		{"iat 6m in future", valid, "node-1", now.Add(-6 * time.Minute), ErrExpired},
		{"wrong node", valid, "node-2", now, ErrWrongNode},
		{"empty node", valid, "", now, ErrWrongNode},
		{"re-signed for other node", resign(withClaims(func(c *api.TaskClaims) { c.NodeID = "node-2" })), "node-1", now, ErrWrongNode},
		{"exp before iat", resign(withClaims(func(c *api.TaskClaims) { c.ExpiresAt = c.IssuedAt - 1 })), "node-1", now, ErrMalformed},
		{"empty string", "", "node-1", now, ErrMalformed},
		{"two segments", seg[0] + "." + seg[1], "node-1", now, ErrMalformed},
		{"four segments", valid + ".x", "node-1", now, ErrMalformed},
		{"padded base64", seg[0] + "=." + seg[1] + "." + seg[2], "node-1", now, ErrMalformed},
		{"newline inside segment", seg[0][:5] + "\n" + seg[0][5:] + "." + seg[1] + "." + seg[2], "node-1", now, ErrMalformed},
		{"std base64 alphabet", strings.NewReplacer("-", "+", "_", "/").Replace(valid) + "+", "node-1", now, ErrMalformed},
		{"json serialization", `{"payload":"` + seg[1] + `","protected":"` + seg[0] + `","signature":"` + seg[2] + `"}`, "node-1", now, ErrMalformed},
		{"header not json", b64.EncodeToString([]byte("nope")) + "." + seg[1] + "." + seg[2], "node-1", now, ErrMalformed},
		{"oversized", strings.Repeat("A", MaxEnvelopeLen+1), "node-1", now, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := v.Verify(tc.token, tc.node, tc.at)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if got.TaskID != c.TaskID || got.NodeID != c.NodeID || got.Type != c.Type ||
					string(got.Params) != string(c.Params) || got.CorrelationID != c.CorrelationID ||
					got.IssuedAt != c.IssuedAt || got.ExpiresAt != c.ExpiresAt {
					t.Fatalf("claims = %+v, want %+v", got, c)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if got.TaskID != "" {
				t.Fatalf("claims returned alongside error: %+v", got)
			}
		})
	}
}

func TestSignHeaderAndKeys(t *testing.T) {
	k := newTestKey(t)
	if len(k.kid) != 16 || k.kid != KeyID(k.pub()) {
		t.Fatalf("kid %q", k.kid)
	}
	j := k.jwk()
	if j.Kty != "OKP" || j.Crv != "Ed25519" || j.Alg != "EdDSA" || j.Use != "sig" || j.Kid != k.kid {
		t.Fatalf("jwk = %+v", j)
	}
	s := NewSigner(k.kid, k.key)
	if s.KeyID() != k.kid || s.PublicJWK() != j {
		t.Fatal("signer key accessors")
	}
	tok := mustSign(t, k, testClaims(time.Now()))
	h, _ := b64.DecodeString(segments(tok)[0])
	var m map[string]any
	if err := json.Unmarshal(h, &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"alg": "EdDSA", "kid": k.kid, "typ": EnvelopeType}
	if len(m) != len(want) {
		t.Fatalf("header = %v", m)
	}
	for key, val := range want {
		if m[key] != val {
			t.Fatalf("header[%s] = %v, want %v", key, m[key], val)
		}
	}
	bad := []struct {
		name string
		s    *Signer
		c    func(*api.TaskClaims)
	}{
		{"no task id", s, func(c *api.TaskClaims) { c.TaskID = "" }},
		{"no type", s, func(c *api.TaskClaims) { c.Type = "" }},
		{"no aud", s, func(c *api.TaskClaims) { c.NodeID = "" }},
		{"no iat", s, func(c *api.TaskClaims) { c.IssuedAt = 0 }},
		{"exp not after iat", s, func(c *api.TaskClaims) { c.ExpiresAt = c.IssuedAt }},
		{"invalid params json", s, func(c *api.TaskClaims) { c.Params = json.RawMessage(`{`) }},
		{"short key", NewSigner("k", k.key[:10]), func(*api.TaskClaims) {}},
		{"empty kid", NewSigner("", k.key), func(*api.TaskClaims) {}},
	}
	for _, tc := range bad {
		c := testClaims(time.Now())
		tc.c(&c)
		if _, err := tc.s.Sign(c); err == nil {
			t.Errorf("%s: Sign succeeded", tc.name)
		}
	}
}

func TestRotation(t *testing.T) {
	now := time.Now()
	oldK, newK := newTestKey(t), newTestKey(t)
	v, err := NewVerifier(api.JWKS{Keys: []api.JWK{oldK.jwk(), newK.jwk()}})
	if err != nil {
		t.Fatal(err)
	}
	oldTok, newTok := mustSign(t, oldK, testClaims(now)), mustSign(t, newK, testClaims(now))
	for _, tok := range []string{oldTok, newTok} {
		if _, err := v.Verify(tok, "node-1", now); err != nil {
			t.Fatalf("during rotation: %v", err)
		}
	}
	if err := v.SetKeys(api.JWKS{Keys: []api.JWK{newK.jwk()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(oldTok, "node-1", now); !errors.Is(err, ErrUnknownKey) || Code(err) != "envelope_unknown_kid" {
		t.Fatalf("old key after rotation: %v", err)
	}
	if _, err := v.Verify(newTok, "node-1", now); err != nil {
		t.Fatalf("new key after rotation: %v", err)
	}
	// A rejected key set leaves the current keys in place.
	if err := v.SetKeys(api.JWKS{}); err == nil {
		t.Fatal("empty JWKS accepted")
	}
	if _, err := v.Verify(newTok, "node-1", now); err != nil {
		t.Fatalf("after rejected SetKeys: %v", err)
	}
}

func TestVerifierConcurrent(t *testing.T) {
	now := time.Now()
	a, b := newTestKey(t), newTestKey(t)
	v, err := NewVerifier(api.JWKS{Keys: []api.JWK{a.jwk(), b.jwk()}})
	if err != nil {
		t.Fatal(err)
	}
	tok := mustSign(t, a, testClaims(now))
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				if _, err := v.Verify(tok, "node-1", now); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for j := 0; j < 200; j++ {
		if err := v.SetKeys(api.JWKS{Keys: []api.JWK{b.jwk(), a.jwk()}}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}

func TestNewVerifierRejects(t *testing.T) {
	k := newTestKey(t)
	mod := func(f func(*api.JWK)) api.JWKS {
		j := k.jwk()
		f(&j)
		return api.JWKS{Keys: []api.JWK{j}}
	}
	tests := []struct {
		name string
		jwks api.JWKS
	}{
		{"empty", api.JWKS{}},
		{"no kid", mod(func(j *api.JWK) { j.Kid = "" })},
		{"kty EC", mod(func(j *api.JWK) { j.Kty = "EC" })},
		{"crv X25519", mod(func(j *api.JWK) { j.Crv = "X25519" })},
		{"alg HS256", mod(func(j *api.JWK) { j.Alg = "HS256" })},
		{"alg empty", mod(func(j *api.JWK) { j.Alg = "" })},
		{"use enc", mod(func(j *api.JWK) { j.Use = "enc" })},
		{"short x", mod(func(j *api.JWK) { j.X = b64.EncodeToString(make([]byte, 31)) })},
		{"x not base64url", mod(func(j *api.JWK) { j.X = "!!!" })},
		{"duplicate kid", api.JWKS{Keys: []api.JWK{k.jwk(), k.jwk()}}},
	}
	for _, tc := range tests {
		if _, err := NewVerifier(tc.jwks); err == nil {
			t.Errorf("%s: NewVerifier succeeded", tc.name)
		}
	}
	if _, err := NewVerifier(mod(func(j *api.JWK) { j.Use = "" })); err != nil {
		t.Errorf("use omitted: %v", err)
	}
}

func TestCheckDelivery(t *testing.T) {
	now := time.Unix(1_900_000_000, 0)
	c := testClaims(now)
	good := api.TaskDelivery{TaskID: c.TaskID, TaskType: c.Type, Envelope: "x", CorrelationID: c.CorrelationID,
		ExpiresAt: time.Unix(c.ExpiresAt, 0).Add(300 * time.Millisecond), Attempt: 3}
	tests := []struct {
		name string
		mod  func(*api.TaskDelivery)
		ok   bool
	}{
		{"match", func(*api.TaskDelivery) {}, true},
		{"task id", func(d *api.TaskDelivery) { d.TaskID = "task-2" }, false},
		{"task type", func(d *api.TaskDelivery) { d.TaskType = "other" }, false},
		{"correlation id", func(d *api.TaskDelivery) { d.CorrelationID = "" }, false},
		{"expires_at", func(d *api.TaskDelivery) { d.ExpiresAt = d.ExpiresAt.Add(time.Hour) }, false},
		{"attempt is unsigned", func(d *api.TaskDelivery) { d.Attempt = 9 }, true},
	}
	for _, tc := range tests {
		d := good
		tc.mod(&d)
		err := CheckDelivery(d, c)
		if tc.ok != (err == nil) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
		if err != nil && (!errors.Is(err, ErrDeliveryMismatch) || Code(err) != "envelope_delivery_mismatch") {
			t.Errorf("%s: err = %v, code %q", tc.name, err, Code(err))
		}
	}
}

func TestCode(t *testing.T) {
	tests := []struct {
		err  error
		code string
	}{
		{nil, ""},
		{fail(ErrMalformed, "x"), "envelope_malformed"},
		{fail(ErrAlgorithm, "x"), "envelope_algorithm_rejected"},
		{fail(ErrUnknownKey, "x"), "envelope_unknown_kid"},
		{fail(ErrSignature, "x"), "envelope_bad_signature"},
		{fail(ErrWrongNode, "x"), "envelope_wrong_node"},
		{fail(ErrExpired, "x"), "envelope_expired"},
		{fail(ErrDeliveryMismatch, "x"), "envelope_delivery_mismatch"},
		{errors.New("other"), "envelope_invalid"},
	}
	for _, tc := range tests {
		if got := Code(tc.err); got != tc.code {
			t.Errorf("Code(%v) = %q, want %q", tc.err, got, tc.code)
		}
	}
}

// FuzzVerify: arbitrary compact strings never panic, and Verify accepts only
// tokens whose exact signing input carries a valid signature by the test key
// and whose claims satisfy every rule.
func FuzzVerify(f *testing.F) {
	now := time.Unix(1_900_000_000, 0)
	seed := make([]byte, ed25519.SeedSize) // fixed key: seeds stay meaningful
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	kid := KeyID(pub)
	v, err := NewVerifier(api.JWKS{Keys: []api.JWK{PublicJWK(kid, pub)}})
	if err != nil {
		f.Fatal(err)
	}
	k := testKey{kid, key}
	c := testClaims(now)
	f.Add(mustSign(f, k, c))
	c2 := c
	c2.Params = nil
	c2.CorrelationID = ""
	f.Add(mustSign(f, k, c2))
	f.Add(signRaw(key, hdr(kid), claimsJSON(f, c, "aud")))
	f.Add(signRaw(key, hdr(kid), []byte(`{}`)))
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	f.Add(signRaw(other, hdr(kid), claimsJSON(f, c)))
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("..")
	f.Fuzz(func(t *testing.T, compact string) {
		got, err := v.Verify(compact, "node-1", now)
		if err != nil {
			if Code(err) == "envelope_invalid" {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		seg := strings.Split(compact, ".")
		if len(seg) != 3 {
			t.Fatalf("accepted %d segments", len(seg))
		}
		sig, derr := b64.DecodeString(seg[2])
		if derr != nil || !ed25519.Verify(pub, []byte(seg[0]+"."+seg[1]), sig) {
			t.Fatalf("accepted a token not signed by the test key: %q", compact)
		}
		if got.TaskID == "" || got.Type == "" || got.NodeID != "node-1" ||
			!now.Before(time.Unix(got.ExpiresAt, 0)) || got.IssuedAt <= 0 ||
			time.Unix(got.IssuedAt, 0).After(now.Add(MaxFutureIssuedAt)) {
			t.Fatalf("accepted claims violating the rules: %+v", got)
		}
	})
}
