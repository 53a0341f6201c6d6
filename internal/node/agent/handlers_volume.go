package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Error codes of volume.list and volume.delete.
const (
	// CodeVolumesUnavailable: this node keeps no named volumes (it runs no
	// instances, or its runtime has no microVM mode).
	CodeVolumesUnavailable = "volumes_unavailable"
	// CodeVolumeInUse: volume.delete of a volume an instance holds; the
	// message names it (destroy it first).
	CodeVolumeInUse = "volume_in_use"
	// CodeVolumeListFailed and CodeVolumeDeleteFailed: the volume store
	// failed (the message says how).
	CodeVolumeListFailed   = "volume_list_failed"
	CodeVolumeDeleteFailed = "volume_delete_failed"
)

// volumeStore is the node's volume store (runtime.VolumesOf: the QEMU
// runtime's microVM mode, also behind a Router), or a HandlerError.
func volumeStore(rt func() runtime.Runtime) (runtime.VolumeStore, error) {
	if r := rt(); r != nil {
		if vs, ok := runtime.VolumesOf(r); ok {
			return vs, nil
		}
	}
	return nil, &HandlerError{api.CodedError{Code: CodeVolumesUnavailable,
		Message: "this node keeps no microVM volumes (its runtime runs no microVMs: NODE_AGENT_QEMU_MICROVM_KERNEL is unset, or the runtime did not start)"}}
}

// storeError is a volume store's failure as a HandlerError: the store
// saying it has no volumes is volumes_unavailable, else code.
func storeError(err error, code string) error {
	msg := err.Error()
	var re *runtime.Error
	if errors.As(err, &re) {
		msg = re.Err.Error()
	}
	if errors.Is(err, runtime.ErrNoVolumes) {
		code = CodeVolumesUnavailable
	}
	return &HandlerError{api.CodedError{Code: code, Message: msg, Err: err}}
}

// VolumeListHandler runs volume.list: the node's named volumes, by name
// (rt gives the agent's runtime, nil when it runs none). Failures:
// invalid_params, volumes_unavailable, volume_list_failed.
func VolumeListHandler(rt func() runtime.Runtime) Handler {
	return Handler{Timeout: task.VolumeTaskTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
		var p task.VolumeListParams
		if fe := task.DecodeParams(t.Params, &p); fe != nil {
			return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
		}
		vs, err := volumeStore(rt)
		if err != nil {
			return Outcome{}, err
		}
		vols, err := vs.ListVolumes(ctx)
		if err != nil {
			return Outcome{}, storeError(err, CodeVolumeListFailed)
		}
		if vols == nil {
			vols = []api.Volume{}
		}
		return Outcome{Output: task.VolumeListOutput{Volumes: vols}}, nil
	}}
}

// VolumeDeleteHandler runs volume.delete: the volume and its data go; a
// volume the node does not have is a success with deleted false. It is
// refused while an instance holds the volume. Failures: invalid_params
// (a name that is not a volume name: no path tricks), volumes_unavailable,
// volume_in_use (naming the holder), volume_delete_failed.
func VolumeDeleteHandler(rt func() runtime.Runtime) Handler {
	return Handler{Timeout: task.VolumeTaskTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
		p, fe := task.DecodeVolumeDeleteParams(t.Params)
		if fe != nil {
			return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
		}
		vs, err := volumeStore(rt)
		if err != nil {
			return Outcome{}, err
		}
		existed, err := vs.DeleteVolume(ctx, p.Name)
		switch {
		case errors.Is(err, runtime.ErrVolumeInUse):
			he := storeError(err, CodeVolumeInUse).(*HandlerError)
			he.Message = fmt.Sprintf("volume %s: %s", p.Name, he.Message)
			return Outcome{}, he
		case err != nil:
			return Outcome{}, storeError(err, CodeVolumeDeleteFailed)
		}
		return Outcome{Output: task.VolumeDeleteOutput{Name: p.Name, Deleted: existed}}, nil
	}}
}

// volumeRuntime is the agent's runtime for the volume tasks (nil when it
// runs no instances).
func (a *Agent) volumeRuntime() runtime.Runtime { return a.imagePullRuntime() }
