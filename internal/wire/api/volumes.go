package api

import (
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

// Named volumes of microVMs: a microVM's container.volumes[i].source is a
// volume name; the host keeps the volume (an ext4 filesystem in a raw file
// or in a qcow2 image, SizeGiB large) under its runtime directory,
// creates it on first use, attaches it to one instance at a time and
// removes it only on an explicit volume.delete task.

// VolumeNamePattern is what a microVM volume's name must match (and it
// must not contain ".."): it names files on the host, so no path tricks.
const VolumeNamePattern = `^[a-z0-9][a-z0-9_.-]{0,62}$`

var volumeNameRE = pattern.Must(VolumeNamePattern, `^[a-z0-9][a-z0-9_.-]*$`, 1, 63)

// ValidVolumeName reports whether name may name a microVM volume.
func ValidVolumeName(name string) bool {
	return volumeNameRE.MatchString(name) && !strings.Contains(name, "..")
}

// Volume formats (VolumeMount.Format); both hold an ext4 filesystem.
const (
	VolumeFormatRaw   = "raw" // a sparse file (the default)
	VolumeFormatQCOW2 = "qcow2"
)

// Volume sizes and counts.
const (
	// DefaultVolumeSizeGiB is the size of a volume created by a mount
	// without size_gib.
	DefaultVolumeSizeGiB = 1
	// MaxVolumeSizeGiB bounds VolumeMount.SizeGiB.
	MaxVolumeSizeGiB = 16384
	// MaxMicroVMVolumes bounds a microVM's volumes (each is a virtio
	// disk; QEMU's microvm machine has few virtio-mmio slots).
	MaxMicroVMVolumes = 8
)

// Volume is a named volume on a host, as volume.list reports it.
type Volume struct {
	Name      string    `json:"name"`
	Format    string    `json:"format"`
	SizeGiB   int       `json:"size_gib"`
	CreatedAt time.Time `json:"created_at"`
	// Holders are the instances it is attached to (at most one: an
	// instance holds its volumes from create to destroy).
	Holders []string `json:"holders,omitempty"`
}
