package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/keys"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// maxSetBody bounds PUT's body: a value of api.MaxSecretValue as base64,
// and room for the JSON around it.
const maxSetBody = api.MaxSecretValue*4/3 + 4096

// name is the request's {name}, checked: 422 when it is not a valid
// secret name (the name only, never a value, is echoed).
func name(r *http.Request) (string, error) {
	n := r.PathValue("name")
	if !api.ValidSecretName(n) {
		return "", httpapi.Invalid([]api.FieldError{{Field: "name", Message: "must match " + api.SecretNamePattern}})
	}
	return n, nil
}

// decodeValue reads PUT's body. Its errors never quote the body: a
// decoder's message could hold a fragment of the value.
func decodeValue(r *http.Request) ([]byte, error) {
	invalid := func(field, msg string) error {
		return httpapi.Invalid([]api.FieldError{{Field: field, Message: msg}})
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxSetBody+1))
	if err != nil {
		return nil, fmt.Errorf("read secret body: %w", err)
	}
	if len(raw) > maxSetBody {
		return nil, invalid("value", fmt.Sprintf("request body larger than %d bytes", maxSetBody))
	}
	var req api.SetSecretRequest
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, &httpapi.Error{Status: http.StatusUnprocessableEntity, CodedError: api.CodedError{Code: "invalid_json",
			Message: `request body: want a JSON object {"value": "..."} or {"value_base64": "..."}`}}
	}
	var v []byte
	switch {
	case (req.Value == nil) == (req.ValueBase64 == nil):
		return nil, invalid("value", "give exactly one of value and value_base64")
	case req.Value != nil:
		if !utf8.ValidString(*req.Value) {
			return nil, invalid("value", "must be UTF-8 text; use value_base64 for bytes")
		}
		v = []byte(*req.Value)
	default:
		if v, err = base64.StdEncoding.DecodeString(*req.ValueBase64); err != nil {
			return nil, invalid("value_base64", "must be standard base64")
		}
	}
	switch {
	case len(v) == 0:
		return nil, invalid("value", "must not be empty")
	case len(v) > api.MaxSecretValue:
		return nil, invalid("value", fmt.Sprintf("must be at most %d bytes", api.MaxSecretValue))
	}
	return v, nil
}

// Set is PUT /api/v1/secrets/{name}: create the secret or replace its
// value (its version grows by one). 201 on creation, 200 on replacement,
// with the metadata only.
func (s *Room) Set(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	n, err := name(r)
	if err != nil {
		return err
	}
	v, err := decodeValue(r)
	if err != nil {
		return err
	}
	sealed, err := s.seal.SealWorkloadSecret(n, v)
	clear(v)
	if errors.Is(err, keys.ErrNoKEK) {
		return httpapi.Errorf(http.StatusConflict, "secrets_need_kek",
			"workload secrets are stored only encrypted: start the control plane with --kek-file")
	} else if err != nil {
		return fmt.Errorf("seal secret %q (correlation id %s): %w", n, httpapi.CorrelationID(ctx), err)
	}
	out, err := s.store.PutWorkloadSecret(ctx, store.WorkloadSecret{Name: n, Value: sealed,
		UpdatedBy: httpapi.Actor(ctx), UpdatedAt: s.now().UTC()}, func(out store.WorkloadSecret) []store.AuditEvent {
		return []store.AuditEvent{s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx), Action: "secret.set", Target: n,
			Result: setResult(out), CID: httpapi.CorrelationID(ctx), Detail: fmt.Sprintf("version=%d", out.Version)})}
	})
	if err != nil {
		return fmt.Errorf("store secret %q (correlation id %s): %w", n, httpapi.CorrelationID(ctx), err)
	}
	status := http.StatusOK
	if out.Version == 1 {
		status = http.StatusCreated
	}
	httpapi.Logger(ctx, s.log).Info("secret set", "name", n, "version", out.Version, "actor", httpapi.Actor(ctx))
	httpapi.WriteJSON(w, status, view(out))
	return nil
}

// List is GET /api/v1/secrets: every secret's metadata, by name.
func (s *Room) List(w http.ResponseWriter, r *http.Request) error {
	all, err := s.store.ListWorkloadSecrets(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Secret, 0, len(all))
	for _, ws := range all {
		out = append(out, view(ws))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// Show is GET /api/v1/secrets/{name}: the metadata only.
func (s *Room) Show(w http.ResponseWriter, r *http.Request) error {
	n, err := name(r)
	if err != nil {
		return err
	}
	ws, err := s.store.GetWorkloadSecret(r.Context(), n)
	if err != nil {
		return httpapi.StoreError(err, "secret", n)
	}
	httpapi.WriteJSON(w, http.StatusOK, view(ws))
	return nil
}

// Delete is DELETE /api/v1/secrets/{name}. Instances that name it keep
// running; their next creation fails with secrets_missing unless the
// agent's local secrets directory has it.
func (s *Room) Delete(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	n, err := name(r)
	if err != nil {
		return err
	}
	if err := s.store.DeleteWorkloadSecret(ctx, n, s.audit.Event(ctx, audit.Entry{Actor: httpapi.Actor(ctx),
		Action: "secret.delete", Target: n, Result: "deleted", CID: httpapi.CorrelationID(ctx)})); err != nil {
		return httpapi.StoreError(err, "secret", n)
	}
	httpapi.Logger(ctx, s.log).Info("secret deleted", "name", n, "actor", httpapi.Actor(ctx))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// setResult is a secret.set record's result: created (its first version)
// or updated.
func setResult(ws store.WorkloadSecret) string {
	if ws.Version == 1 {
		return "created"
	}
	return "updated"
}
