package task

import (
	"encoding/json"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

const (
	// TypeVolumeList lists the named volumes a node keeps for its
	// microVMs: name, format, size, and the instance holding each.
	TypeVolumeList = "volume.list"
	// TypeVolumeDelete deletes a named volume and its data: the only way
	// one goes (destroying its instance keeps it). It is refused while an
	// instance holds it (error code volume_in_use).
	TypeVolumeDelete = "volume.delete"
	// VolumeTaskTimeout bounds volume.list and volume.delete on the agent.
	VolumeTaskTimeout = 30 * time.Second
)

// VolumeListParams are volume.list's params: none.
type VolumeListParams struct{}

// VolumeListOutput is volume.list's output.
type VolumeListOutput struct {
	Volumes []api.Volume `json:"volumes"`
}

// VolumeDeleteParams are volume.delete's params.
type VolumeDeleteParams struct {
	// Name is the volume (api.ValidVolumeName).
	Name string `json:"name"`
}

// VolumeDeleteOutput is volume.delete's output; Deleted is false when the
// node had no such volume (nothing to do, not an error).
type VolumeDeleteOutput struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

// VolumeListSpec is volume.list's registry entry.
func VolumeListSpec() Spec {
	return Spec{Type: TypeVolumeList, Validate: validateVolumeList, Timeout: VolumeTaskTimeout,
		Meaning: "list the named volumes the node keeps for microVMs (format, size, the instance holding each)",
		Params:  VolumeListParams{}}
}

// VolumeDeleteSpec is volume.delete's registry entry.
func VolumeDeleteSpec() Spec {
	return Spec{Type: TypeVolumeDelete, Validate: validateVolumeDelete, Timeout: VolumeTaskTimeout,
		Meaning: "delete a named microVM volume and its data; refused while an instance holds it (volume_in_use)",
		Params:  VolumeDeleteParams{}}
}

func validateVolumeList(params json.RawMessage) []api.FieldError {
	var p VolumeListParams
	return DecodeParams(params, &p)
}

// DecodeVolumeDeleteParams strictly decodes and validates volume.delete's
// params; the server and the agent both use it.
func DecodeVolumeDeleteParams(params json.RawMessage) (VolumeDeleteParams, []api.FieldError) {
	var p VolumeDeleteParams
	if fe := DecodeParams(params, &p); fe != nil {
		return VolumeDeleteParams{}, fe
	}
	if !api.ValidVolumeName(p.Name) {
		return VolumeDeleteParams{}, []api.FieldError{{Field: "params.name",
			Message: "must be a volume name (" + api.VolumeNamePattern + `, no "..")`}}
	}
	return p, nil
}

func validateVolumeDelete(params json.RawMessage) []api.FieldError {
	_, fe := DecodeVolumeDeleteParams(params)
	return fe
}
