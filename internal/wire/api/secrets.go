package api

import (
	"time"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

// SecretNamePattern is what a workload secret's name must match.
const SecretNamePattern = `^[a-z0-9][a-z0-9_.-]{0,62}$`

var secretNameRE = pattern.Must(SecretNamePattern, `^[a-z0-9][a-z0-9_.-]*$`, 1, 63)

// ValidSecretName reports whether name is a valid workload secret name.
func ValidSecretName(name string) bool { return secretNameRE.MatchString(name) }

// MaxSecretValue bounds a workload secret's value (64 KiB).
const MaxSecretValue = 64 << 10

// SetSecretRequest is PUT /api/v1/secrets/{name}: exactly one of Value
// (UTF-8 text) and ValueBase64 (any bytes, standard base64).
type SetSecretRequest struct {
	Value       *string `json:"value,omitempty"`
	ValueBase64 *string `json:"value_base64,omitempty"`
}

// Secret is a workload secret's metadata as the operator API shows it: the
// value is never part of any answer.
type Secret struct {
	Name      string    `json:"name"`
	Version   int64     `json:"version"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedBy string    `json:"updated_by"`
	UpdatedAt time.Time `json:"updated_at"`
}

// InstanceSecrets is the node route's answer for one instance: the values
// of the secrets its spec names that the control plane holds, and the
// names it does not hold (the agent looks for those in its local
// secrets directory).
type InstanceSecrets struct {
	InstanceID string           `json:"instance_id"`
	Secrets    []InstanceSecret `json:"secrets"`
	Missing    []string         `json:"missing,omitempty"`
}

// InstanceSecret is one secret's value (base64 in JSON) and version.
type InstanceSecret struct {
	Name    string `json:"name"`
	Version int64  `json:"version"`
	Value   []byte `json:"value"`
}
