package agent_test

// Task envelopes for agent-level tests: valid claims and signatures, and
// the tampered forms the agent must refuse.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// claims returns valid claims for a task of typ addressed to testNodeID.
func claims(taskID, typ string) api.TaskClaims {
	now := time.Now()
	return api.TaskClaims{TaskID: taskID, NodeID: testNodeID, Type: typ, Params: json.RawMessage(`{"n":1}`),
		CorrelationID: "cid-" + taskID, IssuedAt: now.Unix(), ExpiresAt: now.Add(10 * time.Minute).Unix()}
}

func sign(t *testing.T, s *task.Signer, c api.TaskClaims) string {
	t.Helper()
	env, err := s.Sign(c)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return env
}

// deliveryFor is the delivery a correct control plane sends for c.
func deliveryFor(c api.TaskClaims, envelope string) api.TaskDelivery {
	return api.TaskDelivery{TaskID: c.TaskID, TaskType: c.Type, Envelope: envelope,
		ExpiresAt: time.Unix(c.ExpiresAt, 0).UTC(), CorrelationID: c.CorrelationID, Attempt: 1}
}

var b64 = base64.RawURLEncoding

// editPayload decodes the payload segment of a compact JWS, applies edit to
// the JSON bytes and re-encodes it, keeping the original header and
// signature. The result is still canonical base64url.
func editPayload(t *testing.T, compact string, edit func([]byte) []byte) string {
	t.Helper()
	segs := strings.Split(compact, ".")
	if len(segs) != 3 {
		t.Fatalf("not a compact JWS: %q", compact)
	}
	payload, err := b64.DecodeString(segs[1])
	if err != nil {
		t.Fatalf("decode payload: %v", err)
	}
	edited := edit(bytes.Clone(payload))
	if bytes.Equal(edited, payload) {
		t.Fatalf("edit did not change the payload %s", payload)
	}
	return segs[0] + "." + b64.EncodeToString(edited) + "." + segs[2]
}

// flipPayloadChar swaps one base64url character in the middle of the
// payload segment for another; a non-final character carries no padding
// bits, so the segment stays canonical base64url but decodes differently.
func flipPayloadChar(t *testing.T, compact string) string {
	t.Helper()
	segs := strings.Split(compact, ".")
	p := []byte(segs[1])
	i := len(p) / 2
	if p[i] == 'A' {
		p[i] = 'B'
	} else {
		p[i] = 'A'
	}
	return segs[0] + "." + string(p) + "." + segs[2]
}

// hs256 re-signs the payload of compact with HS256, using the Ed25519 public
// key bytes of jwk as the HMAC secret (the classic algorithm-confusion
// attack).
func hs256(t *testing.T, compact string, jwk api.JWK) string {
	t.Helper()
	segs := strings.Split(compact, ".")
	pub, err := b64.DecodeString(jwk.X)
	if err != nil {
		t.Fatalf("decode jwk x: %v", err)
	}
	hdr := b64.EncodeToString([]byte(fmt.Sprintf(`{"alg":"HS256","kid":%q,"typ":%q}`, jwk.Kid, task.EnvelopeType)))
	mac := hmac.New(sha256.New, pub)
	mac.Write([]byte(hdr + "." + segs[1]))
	return hdr + "." + segs[1] + "." + b64.EncodeToString(mac.Sum(nil))
}
