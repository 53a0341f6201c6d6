package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/kek"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestSecretsAfterKEKRotation: a workload secret set under the old KEK is,
// after `drover keys rotate-kek`'s step (server.SealAtRest with the new
// KEK first and the old one behind), sealed with the new KEK: the old KEK
// no longer opens the row, and a control plane holding only the new KEK
// delivers the value through the node route.
func TestSecretsAfterKEKRotation(t *testing.T) {
	st := openSQLite(t)
	e1 := startEnv(t, st)
	const value = "rotated-s3cr3t-value"
	if code, raw := e1.rawOp(http.MethodPut, "/api/v1/secrets/db-password", `{"value":"`+value+`"}`); code != http.StatusCreated {
		t.Fatalf("set: %d %s", code, raw)
	}
	e1.stop()
	e1.stop = nil

	newKey, err := kek.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A dashboard session begun before the rotation: its operator token
	// sealed with the old KEK.
	sealedToken, err := testKEK().Seal("dashboard_session/hash-s", []byte("operator-token"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateDashboardSession(ctx, store.DashboardSession{IDHash: "hash-s", TokenID: "tok_s", Token: sealedToken,
		CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}, 0); err != nil {
		t.Fatal(err)
	}
	newRing := kek.NewRing(newKey)
	n, err := server.SealAtRest(ctx, st, kek.NewRing(newKey, testKEKKey()), testLogger(t))
	if err != nil || n < 4 { // the CA key, a signing key, the workload secret, the session
		t.Fatalf("rotate: %d rows rewritten, %v", n, err)
	}
	if ds, err := st.GetDashboardSession(ctx, "hash-s"); err != nil {
		t.Fatal(err)
	} else if tok, err := newRing.Open("dashboard_session/hash-s", ds.Token); err != nil || string(tok) != "operator-token" {
		t.Errorf("the session's token after the rotation: %q, %v; want it sealed with the new KEK", tok, err)
	}
	ws, err := st.GetWorkloadSecret(ctx, "db-password")
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := kek.KeyID(ws.Value); id != newRing.PrimaryID() {
		t.Errorf("the secret is sealed with KEK %q, want the new %q", id, newRing.PrimaryID())
	}
	if _, err := testKEK().Open("workload_secret/db-password", ws.Value); !errors.Is(err, kek.ErrUnknownKey) {
		t.Errorf("the old KEK on the re-sealed row: %v, want ErrUnknownKey", err)
	}

	e2 := startEnv(t, st, func(c *server.Config) { c.KEK = newRing })
	n1 := e2.enroll("rot-n1", e2.createHost("rot-n1").Token)
	putInstance(t, st, "in-rot", "rot-n1", "db-password")
	code, ecode, raw := e2.nodeCall(n1.client, http.MethodGet, nodePath(n1.id, "/instances/in-rot/secrets"), nil)
	var got api.InstanceSecrets
	if code != http.StatusOK || json.Unmarshal(raw, &got) != nil {
		t.Fatalf("node fetch after the rotation: %d %s %s", code, ecode, raw)
	}
	if len(got.Secrets) != 1 || string(got.Secrets[0].Value) != value || got.Secrets[0].Version != 1 {
		t.Errorf("node fetch after the rotation: %+v, want db-password at version 1 with its value", got.Secrets)
	}
}
