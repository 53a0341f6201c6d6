package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/volume"
	"github.com/drover-dev/drover/internal/wire/api"
)

// A microVM's named volumes (MicroVMOptions.Volumes, a volume.Manager
// under <root>/volumes): Create ensures each (made on first use with its
// size and format), checks its file and attaches it to the instance (one
// live instance at a time; the holder is the instance id); the command
// line gives each a virtio disk with a serial of its own and the config
// drive tells drover-init where to mount it; Start checks and claims them
// again; Destroy detaches them and never deletes one (volume.delete does,
// refused while attached); Recover drops holders whose instance is gone.
// Every failure is volume_attach_failed.

var _ runtime.VolumeStore = (*Runtime)(nil)

// VolumeDrive is one named volume of a microVM as attached: the volume's
// file and its own format (never probed), the virtio serial the guest
// finds it by, and whether the guest gets it read-only.
type VolumeDrive struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Format   string `json:"format"`
	Serial   string `json:"serial"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// volumeSerial is the virtio serial of a microVM's i-th volume; it fits
// virtio-blk's 20 bytes ("drover-vol" and at most two digits).
func volumeSerial(i int) string { return "drover-vol" + strconv.Itoa(i) }

// volumeArgs are the drives and virtio disks of a microVM's volumes on
// bus ("device": virtio-mmio, "pci").
func volumeArgs(vols []VolumeDrive, bus string) []string {
	var a []string
	for i, v := range vols {
		id := "vol" + strconv.Itoa(i)
		drive := "if=none,id=" + id + ",file=" + qemuValue(v.Path) + ",format=" + v.Format
		if v.ReadOnly {
			drive += ",readonly=on"
		}
		a = append(a, "-drive", drive, "-device", "virtio-blk-"+bus+",drive="+id+",serial="+v.Serial)
	}
	return a
}

// validateVolumes checks a microVM's volumes (the control plane checks
// the same, as spec.container.volumes): a volume name each, mounted once,
// at a clean absolute target the init does not own, a size and format
// the volume manager can create.
func validateVolumes(id string, vols []runtime.Volume) error {
	if len(vols) > api.MaxMicroVMVolumes {
		return invalid(api.ReasonVolumeAttachFailed, id, "spec.volumes: %d volumes, at most %d per microVM", len(vols), api.MaxMicroVMVolumes)
	}
	sources, targets := map[string]bool{}, map[string]bool{}
	for i, v := range vols {
		field := fmt.Sprintf("spec.volumes[%d]", i)
		switch t := v.Target; {
		case !api.ValidVolumeName(v.Source):
			return invalid(api.ReasonVolumeAttachFailed, id, "%s.source %q: want a volume name (%s, no \"..\"); a microVM mounts no host paths", field, v.Source, api.VolumeNamePattern)
		case sources[v.Source]:
			return invalid(api.ReasonVolumeAttachFailed, id, "%s.source: volume %q is mounted twice", field, v.Source)
		case !path.IsAbs(t) || path.Clean(t) != t || t == "/":
			return invalid(api.ReasonVolumeAttachFailed, id, "%s.target %q: want a clean absolute path other than /", field, t)
		case guestOwned(t):
			return invalid(api.ReasonVolumeAttachFailed, id, "%s.target %q is the guest's own (/proc, /sys, /dev, /run/drover)", field, t)
		case targets[t]:
			return invalid(api.ReasonVolumeAttachFailed, id, "%s.target %q is mounted twice", field, t)
		case v.SizeGiB < 0 || v.SizeGiB > api.MaxVolumeSizeGiB:
			return invalid(api.ReasonVolumeAttachFailed, id, "%s.size_gib %d: want 0-%d", field, v.SizeGiB, api.MaxVolumeSizeGiB)
		case v.Format != "" && v.Format != api.VolumeFormatRaw && v.Format != api.VolumeFormatQCOW2:
			return invalid(api.ReasonVolumeAttachFailed, id, "%s.format %q: want raw or qcow2", field, v.Format)
		}
		sources[v.Source], targets[v.Target] = true, true
	}
	return nil
}

// guestOwned reports whether a guest path is, or is under, a directory
// drover-init mounts itself.
func guestOwned(t string) bool {
	for _, d := range []string{"/proc", "/sys", "/dev", "/run/drover"} {
		if t == d || strings.HasPrefix(t, d+"/") {
			return true
		}
	}
	return false
}

// volumes is the volume manager; nil without the microVM mode or volumes.
func (r *Runtime) volumes() *volume.Manager {
	if mv := r.opts.MicroVM; mv != nil {
		return mv.Volumes
	}
	return nil
}

// volumeHolderLive says whether a volume's holder is still an instance:
// its directory exists (from Create's first step to Destroy's last), known
// to this Runtime or not yet recovered.
func (r *Runtime) volumeHolderLive(id string) bool {
	if !runtime.ValidID(id) {
		return false
	}
	_, err := os.Stat(filepath.Join(r.instDir, id))
	return err == nil
}

// volumeErr is a volume failure of instance id as volume_attach_failed,
// naming the volume (without the manager's own prefix).
func volumeErr(op, id, name string, err error) error {
	var re *runtime.Error
	if errors.As(err, &re) {
		err = re.Err
	}
	return runtime.Errorf(api.ReasonVolumeAttachFailed, op, id, "volume %s: %w", name, err)
}

// attachVolumes ensures, checks and attaches each of a microVM's volumes
// for instance id: what the config drive tells the init, and what the
// command line attaches. On failure none stays attached.
func (r *Runtime) attachVolumes(ctx context.Context, id string, vols []runtime.Volume) ([]guestinit.Volume, []VolumeDrive, error) {
	if len(vols) == 0 {
		return nil, nil, nil
	}
	m := r.volumes()
	if m == nil {
		return nil, nil, runtime.Errorf(api.ReasonVolumeAttachFailed, "create", id, "spec.volumes: this agent keeps no microVM volumes")
	}
	var guest []guestinit.Volume
	var drives []VolumeDrive
	for i, v := range vols {
		vol, err := m.Ensure(ctx, v.Source, v.SizeGiB, volume.Format(v.Format))
		if err == nil {
			err = m.Check(ctx, vol)
		}
		if err == nil {
			err = m.Attach(v.Source, id, r.volumeHolderLive)
		}
		if err != nil {
			r.detachVolumes(id, drives)
			return nil, nil, volumeErr("create", id, v.Source, err)
		}
		d := VolumeDrive{Name: vol.Name, Path: vol.Path, Format: string(vol.Format), Serial: volumeSerial(i), ReadOnly: v.ReadOnly}
		drives = append(drives, d)
		guest = append(guest, guestinit.Volume{Serial: d.Serial, Target: v.Target, ReadOnly: v.ReadOnly})
	}
	return guest, drives, nil
}

// claimVolumes checks a microVM's volumes again before a boot (each still
// there, the same file, still a filesystem) and attaches them to id
// again: a holder that an agent crash lost is taken back, one another
// live instance took meanwhile is refused. The error is Start's to wrap.
func (r *Runtime) claimVolumes(ctx context.Context, id string, drives []VolumeDrive) error {
	if len(drives) == 0 {
		return nil
	}
	m := r.volumes()
	if m == nil {
		return errors.New("spec.volumes: this agent keeps no microVM volumes")
	}
	for _, d := range drives {
		v, ok, err := m.Get(d.Name)
		if err == nil && !ok {
			err = fmt.Errorf("volume %s is gone", d.Name)
		}
		if err == nil && (v.Path != d.Path || string(v.Format) != d.Format) {
			err = fmt.Errorf("volume %s changed since the instance was created (now %s %s)", d.Name, v.Format, v.Path)
		}
		if err == nil {
			err = m.Check(ctx, v)
		}
		if err == nil {
			err = m.Attach(d.Name, id, r.volumeHolderLive)
		}
		if err != nil {
			var re *runtime.Error
			if errors.As(err, &re) {
				err = re.Err
			}
			return fmt.Errorf("volume %s: %w", d.Name, err)
		}
	}
	return nil
}

// detachVolumes lets go of id's volumes (Destroy, a failed Create); a
// failure is logged: the holder is dropped later, once the instance's
// directory is gone (volumeHolderLive).
func (r *Runtime) detachVolumes(id string, drives []VolumeDrive) {
	m := r.volumes()
	if m == nil {
		return
	}
	for _, d := range drives {
		if err := m.Detach(d.Name, id); err != nil {
			r.log.Warn("detach volume", "id", id, "volume", d.Name, "err", err)
		}
	}
}

// reconcileVolumes drops the holders that are no instance any more (an
// agent that crashed between a half-made Create and its cleanup, or a
// destroy and its detach) and the leftovers of interrupted creations;
// Recover runs it once every instance directory is settled.
func (r *Runtime) reconcileVolumes() {
	m := r.volumes()
	if m == nil {
		return
	}
	entries, err := os.ReadDir(r.instDir)
	if err != nil {
		r.log.Warn("reconcile volumes", "err", err)
		return
	}
	var live []string
	for _, e := range entries {
		if e.IsDir() && runtime.ValidID(e.Name()) {
			live = append(live, e.Name())
		}
	}
	if err := m.Reconcile(live); err != nil {
		r.log.Warn("reconcile volumes", "err", err)
	}
}

// ListVolumes returns the host's volumes (volume.list).
func (r *Runtime) ListVolumes(ctx context.Context) ([]api.Volume, error) {
	m := r.volumes()
	if m == nil {
		return nil, runtime.ErrNoVolumes
	}
	vols, err := m.List()
	if err != nil {
		return nil, err
	}
	out := make([]api.Volume, 0, len(vols))
	for _, v := range vols {
		out = append(out, api.Volume{Name: v.Name, Format: string(v.Format), SizeGiB: v.SizeGiB, CreatedAt: v.CreatedAt, Holders: v.Holders})
	}
	return out, nil
}

// DeleteVolume removes a volume and its data (volume.delete); it is
// refused (runtime.ErrVolumeInUse) while an instance holds it, and holders
// that are no instance any more do not count.
func (r *Runtime) DeleteVolume(ctx context.Context, name string) (bool, error) {
	m := r.volumes()
	if m == nil {
		return false, runtime.ErrNoVolumes
	}
	existed, err := m.Delete(ctx, name, r.volumeHolderLive)
	if err == nil && existed {
		r.log.Info("volume deleted", "volume", name)
	}
	return existed, err
}

// initVolumeFailure reports whether drover-init's failure is one of
// mounting a volume (its error starts with guestinit.VolumeErrorPrefix).
func initVolumeFailure(rep guestinit.Report) bool {
	return rep.Event == guestinit.EventFailed && strings.HasPrefix(rep.Error, guestinit.VolumeErrorPrefix)
}
