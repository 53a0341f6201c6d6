package runtime

import (
	"context"
	"errors"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Errors of a VolumeStore.
var (
	// ErrVolumeInUse: a volume an instance holds cannot be deleted, nor
	// attached to a second instance.
	ErrVolumeInUse = errors.New("volume is attached to an instance")
	// ErrNoVolumes: the runtime keeps no named volumes (the QEMU runtime
	// without its microVM mode).
	ErrNoVolumes = errors.New("this runtime keeps no named volumes (microVM mode off)")
)

// VolumeStore is a runtime that keeps named volumes for its instances
// (the QEMU runtime's microVM mode): the agent's volume.list and
// volume.delete tasks.
type VolumeStore interface {
	// ListVolumes returns every volume on the host, by name.
	ListVolumes(ctx context.Context) ([]api.Volume, error)
	// DeleteVolume removes a volume and its data; existed is false when
	// there was none (not an error). A volume a live instance holds is
	// refused with an error wrapping ErrVolumeInUse that names it.
	DeleteVolume(ctx context.Context, name string) (existed bool, err error)
}

// VolumesOf is rt's volume store: rt itself, or a Router's VM runtime;
// false when neither keeps volumes.
func VolumesOf(rt Runtime) (VolumeStore, bool) {
	if v, ok := rt.(VolumeStore); ok {
		return v, true
	}
	if r, ok := rt.(*Router); ok && r.vm != nil {
		v, ok := r.vm.(VolumeStore)
		return v, ok
	}
	return nil, false
}
