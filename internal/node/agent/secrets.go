package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"time"
)

// secretsFetchTimeout bounds one fetch of an instance's secrets.
const secretsFetchTimeout = 30 * time.Second

// instanceSecrets is the reconciler's secret source (reconcile.Options.
// Secrets). Precedence, per name: the control plane first (GET
// /internal/v1/nodes/{id}/instances/{iid}/secrets over mTLS, which answers
// only for an instance placed on this node and only the names its spec
// lists), then a file of that name in NODE_AGENT_SECRETS_DIR. A name
// neither has is missing (fs.ErrNotExist: secrets_missing before any
// Create); a transport error, a refusal other than 404 or an unreadable
// file is secrets_injection_failed, with no fallback. A 404 (the control
// plane does not know the instance on this node, e.g. one declared before
// it was placed) leaves every name to the directory. The values live in
// memory for the Create call only: nothing here logs or persists them.
func (a *Agent) instanceSecrets(ctx context.Context, instanceID string, names []string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(names))
	cid := newSecretsCID()
	if a.node != nil {
		fctx, cancel := context.WithTimeout(ctx, secretsFetchTimeout)
		got, err := a.node.InstanceSecrets(fctx, a.node.node(), instanceID, cid)
		cancel()
		switch {
		case err == nil:
			for _, s := range got.Secrets {
				out[s.Name] = s.Value
			}
		case IsStatus(err, http.StatusNotFound):
			a.log.Info("control plane holds no secrets for this instance; reading NODE_AGENT_SECRETS_DIR",
				"instance_id", instanceID, "correlation_id", cid)
		default:
			return nil, fmt.Errorf("fetch secrets of instance %s from the control plane (correlation id %s): %w",
				instanceID, cid, err)
		}
	}
	var missing []string
	for _, name := range names {
		if _, ok := out[name]; ok {
			continue
		}
		b, err := a.readSecret(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			missing = append(missing, name)
		case err != nil:
			return nil, fmt.Errorf("instance %s (correlation id %s): %w", instanceID, cid, err)
		default:
			out[name] = b
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("instance %s: secrets %q: neither the control plane nor NODE_AGENT_SECRETS_DIR has them (correlation id %s): %w",
			instanceID, missing, cid, fs.ErrNotExist)
	}
	return out, nil
}

// newSecretsCID is the correlation id of one fetch: the control plane's
// audit record of it carries the same.
func newSecretsCID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "secrets-" + hex.EncodeToString(b)
}
