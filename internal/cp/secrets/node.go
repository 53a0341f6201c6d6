package secrets

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// NodeFetch (nodeapi.InstanceSecrets) answers the values of the secrets
// instance {iid}'s spec names, to the node it is placed on only: an
// instance that does not exist, is placed on another node, or names no
// secrets is 404 instance_not_found and audited as denied. ?name= (any
// number of times) narrows the answer to those names, each of which the
// spec must list (else 404 secret_not_found, audited as denied). Names the
// spec lists that the control plane does not hold come back in missing.
// The answer is never cached (Cache-Control: no-store); a value that does
// not open with the KEK is a 500 whose log names the secret, never its
// content; a delivery whose secret.fetch record cannot be stored is a 503
// audit_unavailable that delivers nothing.
func (s *Room) NodeFetch(w http.ResponseWriter, r *http.Request, nodeID string) error {
	ctx := r.Context()
	iid := r.PathValue("iid")
	cid := httpapi.CorrelationID(ctx)
	deny := func(code, detail string) error {
		s.audit.Record(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "secret.fetch", Target: iid, Result: "denied",
			CID: cid, Detail: detail})
		return httpapi.Errorf(http.StatusNotFound, code, "%s", detail)
	}
	in, err := s.store.GetInstance(ctx, iid)
	if errors.Is(err, store.ErrNotFound) || (err == nil && in.HostID != nodeID) {
		return deny("instance_not_found", fmt.Sprintf("instance %q not found for node %q", iid, nodeID))
	} else if err != nil {
		return fmt.Errorf("fetch secrets of instance %s (correlation id %s): %w", iid, cid, err)
	}
	var spec api.InstanceSpec
	if err := json.Unmarshal(in.Spec, &spec); err != nil {
		return fmt.Errorf("instance %s: decode spec (correlation id %s): %w", iid, cid, err)
	}
	if len(spec.Secrets) == 0 {
		return deny("instance_not_found", fmt.Sprintf("instance %q names no secrets", iid))
	}
	names := spec.Secrets
	if asked := r.URL.Query()["name"]; len(asked) > 0 {
		for _, n := range asked {
			if !slices.Contains(spec.Secrets, n) {
				return deny("secret_not_found", fmt.Sprintf("instance %q does not name secret %q", iid, n))
			}
		}
		names = asked
	}
	out := api.InstanceSecrets{InstanceID: iid, Secrets: make([]api.InstanceSecret, 0, len(names))}
	var versions []string
	for _, n := range names {
		if !api.ValidSecretName(n) { // the spec allows names only a local directory can hold
			out.Missing = append(out.Missing, n)
			continue
		}
		ws, err := s.store.GetWorkloadSecret(ctx, n)
		if errors.Is(err, store.ErrNotFound) {
			out.Missing = append(out.Missing, n)
			continue
		} else if err != nil {
			return fmt.Errorf("fetch secret %q for instance %s (correlation id %s): %w", n, iid, cid, err)
		}
		v, err := s.seal.OpenWorkloadSecret(n, ws.Value)
		if err != nil {
			s.audit.Record(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "secret.fetch", Target: iid, Result: "failed",
				CID: cid, Detail: fmt.Sprintf("secret %s version %d does not decrypt", n, ws.Version)})
			return fmt.Errorf("open secret %q for instance %s (correlation id %s): %w", n, iid, cid, err)
		}
		out.Secrets = append(out.Secrets, api.InstanceSecret{Name: n, Version: ws.Version, Value: v})
		versions = append(versions, fmt.Sprintf("%s@%d", n, ws.Version))
	}
	defer func() {
		for _, sec := range out.Secrets {
			clear(sec.Value)
		}
	}()
	// No secret leaves unrecorded: a delivery whose record cannot be
	// stored is refused.
	if err := s.audit.Require(ctx, audit.Entry{Actor: "node:" + nodeID, Action: "secret.fetch", Target: iid, Result: "ok",
		CID: cid, Detail: fmt.Sprintf("delivered=%v missing=%v", versions, out.Missing)}); err != nil {
		return &httpapi.Error{Status: http.StatusServiceUnavailable, RetryAfter: 5, CodedError: api.CodedError{Code: "audit_unavailable",
			Message: fmt.Sprintf("the delivery of instance %s's secrets could not be recorded, so none was delivered; retry (correlation id %s)", iid, cid)}}
	}
	w.Header().Set("Cache-Control", "no-store")
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
