package instances

import (
	"fmt"
	"path"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// validateMicroVM checks a spec with runtime "microvm": an OCI image
// (container.image, optionally container.digest) or a raw ext4 root
// filesystem artifact (image) with container.command; command, args, env
// and registry_auth from container; user networking or mode bridge (a tap
// on the agent's bridge, an address from its CIDR), with forwards;
// readiness by serial marker, tcp_port or http_path; named volumes
// (validateMicroVMVolumes). What microVMs do not have (GPUs, ulimits,
// shm_size_mib) is refused by name.
func validateMicroVM(f *fieldErrs, s api.InstanceSpec) {
	c := s.Container
	hasArtifact := s.Image != (api.Artifact{})
	switch {
	case c == nil && !hasArtifact:
		f.add("container", "required with runtime %q (container.image: the OCI image to boot)", api.RuntimeMicroVM)
		return
	case c != nil && c.Image != "" && hasArtifact:
		f.add("image", "a microVM boots container.image or image (a raw ext4 root filesystem), not both")
	case hasArtifact:
		validateArtifact(f, "image", s.Image)
		if c == nil || len(c.Command) == 0 {
			f.add("container.command", "required with a root filesystem image (it has no image config)")
		}
	}
	if c == nil {
		c = &api.ContainerSpec{}
	}
	if c.Image != "" && (strings.ContainsAny(c.Image, " \t\r\n@") || len(c.Image) > 255) {
		f.add("container.image", "must be an image reference such as registry.example/repo:tag (pin a digest with container.digest)")
	}
	if c.Digest != "" && !imageDigestRE.MatchString(c.Digest) {
		f.add("container.digest", "must be sha256:<64 lowercase hex digits>")
	}
	for k := range c.Env {
		if !envKeyRE.MatchString(k) {
			f.add("container.env", "%q is not a variable name", k)
		}
	}
	if len(c.GPUs) > 0 || c.Ulimits != nil || c.ShmSizeMiB != 0 {
		f.add("container", "a microVM has no gpus, ulimits or shm_size_mib")
	}
	validateMicroVMVolumes(f, c.Volumes)
	if c.RegistryAuth != "" && !contains(s.Secrets, c.RegistryAuth) {
		f.add("container.registry_auth", "must name one of spec.secrets")
	}
	if s.Boot != nil || s.CloudInit != nil || len(s.Slots) > 0 || s.GPUs != 0 {
		f.add("runtime", "a microVM boots the host's microVM kernel and drover-init: no boot, cloud_init, slots or gpus")
	}
	if s.Network.Mode != "" && s.Network.Mode != api.NetworkUser && s.Network.Mode != api.NetworkBridge || s.Network.Bridge != "" {
		f.add("network", "a microVM has user networking or mode bridge (a tap on the agent's bridge), with forwards; no network.bridge")
	}
	if r := s.Readiness; r.HTTPPath != "" && (r.TCPPort == 0 || !strings.HasPrefix(r.HTTPPath, "/")) {
		f.add("readiness.http_path", "needs tcp_port and must start with /")
	}
}

// validateMicroVMVolumes checks a microVM's container.volumes: each a
// named volume (no host paths) mounted once, at a clean absolute target
// that is not the root, the guest's /proc, /sys or /dev, or /run/drover
// (secrets); size_gib 0-MaxVolumeSizeGiB (0: 1 GiB for a new volume, an
// existing one as it is), format "", "raw" or "qcow2"; at most
// MaxMicroVMVolumes. Whether an existing volume fits (its format and size)
// only the host knows: volume_attach_failed.
func validateMicroVMVolumes(f *fieldErrs, vols []api.VolumeMount) {
	if len(vols) > api.MaxMicroVMVolumes {
		f.add("container.volumes", "at most %d volumes per microVM (each is a virtio disk)", api.MaxMicroVMVolumes)
	}
	sources, targets := map[string]bool{}, map[string]bool{}
	for i, v := range vols {
		p := fmt.Sprintf("container.volumes[%d]", i)
		switch {
		case !api.ValidVolumeName(v.Source):
			f.add(p+".source", "must be a volume name (1-63 of a-z 0-9 _ . -, starting with a letter or digit, no \"..\"): a microVM mounts no host paths")
		case sources[v.Source]:
			f.add(p+".source", "volume %q is mounted twice", v.Source)
		}
		sources[v.Source] = true
		switch t := v.Target; {
		case !path.IsAbs(t) || path.Clean(t) != t || t == "/":
			f.add(p+".target", "must be a clean absolute path other than /")
		case reservedGuestPath(t):
			f.add(p+".target", "%s is the guest's own (/proc, /sys, /dev, /run/drover)", t)
		case targets[t]:
			f.add(p+".target", "%s is mounted twice", t)
		}
		targets[v.Target] = true
		if v.SizeGiB < 0 || v.SizeGiB > api.MaxVolumeSizeGiB {
			f.add(p+".size_gib", "must be between 0 (%d GiB for a new volume; an existing one keeps its size) and %d", api.DefaultVolumeSizeGiB, api.MaxVolumeSizeGiB)
		}
		if v.Format != "" && v.Format != api.VolumeFormatRaw && v.Format != api.VolumeFormatQCOW2 {
			f.add(p+".format", "must be %q (the default) or %q", api.VolumeFormatRaw, api.VolumeFormatQCOW2)
		}
	}
}

// reservedGuestPath reports whether a guest path is, or is under, a
// directory drover-init mounts itself.
func reservedGuestPath(t string) bool {
	for _, d := range []string{"/proc", "/sys", "/dev", "/run/drover"} {
		if t == d || strings.HasPrefix(t, d+"/") {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
