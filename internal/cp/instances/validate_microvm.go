package instances

import (
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// validateMicroVM checks a spec with runtime "microvm": an OCI image
// (container.image, optionally container.digest) or a raw ext4 root
// filesystem artifact (image) with container.command; command, args, env
// and registry_auth from container; user networking or mode bridge (a tap
// on the agent's bridge, an address from its CIDR), with forwards;
// readiness by serial marker, tcp_port or http_path. What microVMs do not
// have yet (volumes, GPUs) is refused by name.
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
	if len(c.Volumes) > 0 || len(c.GPUs) > 0 || c.Ulimits != nil || c.ShmSizeMiB != 0 {
		f.add("container", "a microVM has no volumes, gpus, ulimits or shm_size_mib (yet)")
	}
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

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
