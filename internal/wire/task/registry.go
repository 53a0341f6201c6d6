// Package task owns what a task is, independent of transport and storage:
// the registry of task types with their parameter validation and timeouts,
// and the signed task envelope (a compact JWS, EdDSA only) that the control
// plane issues and the node agent verifies. It must not do I/O, talk to the
// store or HTTP, run handlers, or keep package-level mutable state; it must
// stay free of cgo and OS-specific code (the agent imports it).
package task

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// LeaseGrace is added to a task type's Timeout to get the server-side lease.
const LeaseGrace = 30 * time.Second

// Spec describes one task type.
type Spec struct {
	// Type is the task type name, e.g. "diag.health_probe".
	Type string
	// Validate checks params, which the registry has already normalised to a
	// JSON object; it returns field errors (api.FieldError{Field:
	// "params.<name>", ...}); nil means valid. DecodeParams helps.
	Validate func(params json.RawMessage) []api.FieldError
	// Timeout bounds the handler on the agent; the server's lease is
	// Timeout + LeaseGrace (see Lease).
	Timeout time.Duration
	// Internal types are created by the control plane itself (the terminal
	// gateway's terminal.open); the operator task API refuses them.
	Internal bool
	// Meaning is one line for docs/contract.md and the task-types route.
	Meaning string
	// Params is the zero value of the type's params struct; docs/contract.md
	// lists its JSON fields.
	Params any
}

// Lease is how long the server waits for a dispatched task's result before
// requeueing it: Timeout + LeaseGrace.
func (s Spec) Lease() time.Duration { return s.Timeout + LeaseGrace }

// Registry maps task types to their specs. It is built once with NewRegistry
// and is read-only afterwards, so it is safe for concurrent use.
type Registry struct {
	specs map[string]Spec
	types []string // sorted
}

// NewRegistry builds a registry from specs. Each spec needs a non-empty Type,
// a Validate func and a positive Timeout; duplicate types are an error.
func NewRegistry(specs ...Spec) (*Registry, error) {
	r := &Registry{specs: make(map[string]Spec, len(specs))}
	for _, s := range specs {
		switch {
		case s.Type == "":
			return nil, errors.New("task: spec with empty type")
		case s.Validate == nil:
			return nil, fmt.Errorf("task: spec %q has no Validate func", s.Type)
		case s.Timeout <= 0:
			return nil, fmt.Errorf("task: spec %q needs a positive Timeout", s.Type)
		case s.Meaning == "":
			return nil, fmt.Errorf("task: spec %q needs a Meaning", s.Type)
		}
		if _, dup := r.specs[s.Type]; dup {
			return nil, fmt.Errorf("task: duplicate task type %q", s.Type)
		}
		r.specs[s.Type] = s
		r.types = append(r.types, s.Type)
	}
	sort.Strings(r.types)
	return r, nil
}

// Lookup returns the spec for typ.
func (r *Registry) Lookup(typ string) (Spec, bool) {
	s, ok := r.specs[typ]
	return s, ok
}

// Types returns the registered types, sorted (a fresh slice).
func (r *Registry) Types() []string { return append([]string(nil), r.types...) }

// Validate checks a task type and its params. An unknown type yields
// FieldError{Field: "type", Message: `unknown task type "x"; registered: a, b`}.
// params must be a JSON object; absent (empty) or null is treated as {}.
// Unknown parameter fields are rejected by the per-type validators.
func (r *Registry) Validate(typ string, params json.RawMessage) []api.FieldError {
	if typ == "" {
		return []api.FieldError{{Field: "type", Message: "type is required; registered: " + strings.Join(r.types, ", ")}}
	}
	spec, ok := r.specs[typ]
	if !ok {
		return []api.FieldError{{Field: "type",
			Message: fmt.Sprintf("unknown task type %q; registered: %s", typ, strings.Join(r.types, ", "))}}
	}
	obj, fe := NormalizeParams(params)
	if fe != nil {
		return fe
	}
	return spec.Validate(obj)
}

// NormalizeParams returns params as a JSON object: empty input and null
// become {}; anything that is not a single JSON object is a field error on
// "params".
func NormalizeParams(params json.RawMessage) (json.RawMessage, []api.FieldError) {
	trimmed := bytes.TrimSpace(params)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return json.RawMessage("{}"), nil
	}
	if trimmed[0] != '{' || !json.Valid(trimmed) {
		return nil, []api.FieldError{{Field: "params", Message: "params must be a JSON object"}}
	}
	return json.RawMessage(trimmed), nil
}

// DecodeParams strictly decodes a params object into dst (a pointer to a
// struct with json tags): unknown fields, type mismatches and trailing data
// become field errors on "params.<name>" (or "params"). Empty or null params
// decode as {}.
func DecodeParams(params json.RawMessage, dst any) []api.FieldError {
	obj, fe := NormalizeParams(params)
	if fe != nil {
		return fe
	}
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return []api.FieldError{paramsDecodeError(err)}
	}
	if dec.More() {
		return []api.FieldError{{Field: "params", Message: "params must be a single JSON object"}}
	}
	return nil
}

func paramsDecodeError(err error) api.FieldError {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" && typeErr.Type != nil {
		return api.FieldError{Field: "params." + typeErr.Field,
			Message: fmt.Sprintf("must be a JSON %s, not %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value)}
	}
	// encoding/json reports unknown fields as `json: unknown field "name"`.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if unq, uerr := strconv.Unquote(name); uerr == nil {
			return api.FieldError{Field: "params." + unq, Message: "unknown parameter"}
		}
	}
	return api.FieldError{Field: "params", Message: "invalid params: " + err.Error()}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "struct", "map":
		return "object"
	case "slice", "array":
		return "array"
	default:
		return "number"
	}
}
