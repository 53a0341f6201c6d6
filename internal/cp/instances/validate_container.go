package instances

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

var (
	imageDigestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	envKeyRE      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)
	volumeRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

// validateRuntime checks spec.runtime and, for containers, spec.container;
// it reports whether the spec is a container's (then the VM-only checks
// are skipped). The agent checks again what only the host knows (its
// allowed volume directories, its GPUs).
func validateRuntime(f *fieldErrs, s api.InstanceSpec) (container bool) {
	switch s.Runtime {
	case "", api.RuntimeQEMU:
		if s.Container != nil {
			f.add("container", "needs runtime %q", api.RuntimeDocker)
		}
		if s.Readiness.HTTPPath != "" {
			f.add("readiness.http_path", "needs runtime %q", api.RuntimeDocker)
		}
		return false
	case api.RuntimeDocker:
	case api.RuntimeMicroVM:
		validateMicroVM(f, s)
		return true
	default:
		f.add("runtime", "must be empty (the host's VM runtime), %q, %q or %q", api.RuntimeQEMU, api.RuntimeDocker, api.RuntimeMicroVM)
		return false
	}
	c := s.Container
	if c == nil {
		f.add("container", "required with runtime %q", api.RuntimeDocker)
		return true
	}
	if s.Image != (api.Artifact{}) || s.Boot != nil || s.CloudInit != nil || len(s.Slots) > 0 || s.DiskGiB != 0 {
		f.add("runtime", "a container has no image artifact, boot, cloud_init, slots or disk_gib (its image is container.image)")
	}
	if s.Network.Mode != "" && s.Network.Mode != api.NetworkUser || s.Network.Bridge != "" || s.Network.MAC != "" {
		f.add("network", "a container has only forwards (published on the host's 127.0.0.1)")
	}
	if c.Image == "" || strings.ContainsAny(c.Image, " \t\r\n@") || len(c.Image) > 255 {
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
	for i, v := range c.Volumes {
		p := fmt.Sprintf("container.volumes[%d]", i)
		if !path.IsAbs(v.Target) {
			f.add(p+".target", "must be an absolute path")
		}
		if !path.IsAbs(v.Source) && !volumeRE.MatchString(v.Source) {
			f.add(p+".source", "must be a volume name or an absolute host path (under the agent's allowed volume directories)")
		}
		// A container's named volume is the engine's: it has no size or
		// format to give (those are microVM volumes').
		if v.SizeGiB != 0 {
			f.add(p+".size_gib", "only a microVM's volumes have a size (runtime %q); a container's named volume is the engine's", api.RuntimeMicroVM)
		}
		if v.Format != "" {
			f.add(p+".format", "only a microVM's volumes have a format (runtime %q); a container's named volume is the engine's", api.RuntimeMicroVM)
		}
	}
	for i, g := range c.GPUs {
		if g == "" || strings.ContainsAny(g, ", \t") || (g == api.GPUsAll && len(c.GPUs) > 1) {
			f.add(fmt.Sprintf("container.gpus[%d]", i), `must be a GPU index or UUID, or "all" alone`)
		}
	}
	if u := c.Ulimits; u != nil && (u.NoFile < 0 || u.NProc < 0) {
		f.add("container.ulimits", "must be >= 0 (0: the agent's default)")
	}
	if c.RegistryAuth != "" && !slices.Contains(s.Secrets, c.RegistryAuth) {
		f.add("container.registry_auth", "must name one of spec.secrets")
	}
	if r := s.Readiness; r.SerialMarker != "" {
		f.add("readiness.serial_marker", "a container has no serial console: use tcp_port and http_path")
	} else if r.HTTPPath != "" && (r.TCPPort == 0 || !strings.HasPrefix(r.HTTPPath, "/")) {
		f.add("readiness.http_path", "needs tcp_port and must start with /")
	}
	return true
}

// hostRuntimes are the runtimes a host reported; an agent reporting none
// runs VMs only.
func hostRuntimes(h store.Host) []string {
	var c api.Capabilities
	if len(h.Capabilities) > 0 && json.Unmarshal(h.Capabilities, &c) == nil && len(c.Runtimes) > 0 {
		return c.Runtimes
	}
	return []string{api.RuntimeQEMU}
}

// runtimeMissing says why host h cannot run spec's runtime ("" when it
// can). The VM runtime ("") is whatever the host runs VMs with.
func runtimeMissing(h store.Host, spec api.InstanceSpec) string {
	if spec.Runtime == "" {
		return ""
	}
	if have := hostRuntimes(h); !slices.Contains(have, spec.Runtime) {
		return fmt.Sprintf("runtime %s not available (host runs %s)", spec.Runtime, strings.Join(have, ", "))
	}
	return ""
}

// hostGPUNames maps every name a host's discovered GPU goes by (its index
// and its UUID) to one key; nil when the host reported no inventory.
func hostGPUNames(h store.Host) map[string]string {
	var c api.Capabilities
	if len(h.Capabilities) == 0 || json.Unmarshal(h.Capabilities, &c) != nil || c.Inventory == nil {
		return nil
	}
	out := map[string]string{}
	for i, g := range c.Inventory.GPUs {
		key := fmt.Sprintf("#%d", i)
		if g.UUID != "" {
			key = g.UUID
			out[g.UUID] = key
		}
		if g.Index != nil {
			out[strconv.Itoa(*g.Index)] = key
		}
	}
	return out
}

// gpuConflict says why host h cannot give the container the GPUs it names
// ("" when it can): a GPU the host's inventory does not list (field is
// then the spec field to blame), or one another container holds.
func gpuConflict(h store.Host, spec api.InstanceSpec, held map[string]string) (why, field string) {
	c := spec.Container
	if c == nil || len(c.GPUs) == 0 || slices.Contains(c.GPUs, api.GPUsAll) {
		return "", ""
	}
	names := hostGPUNames(h)
	canon := func(g string) string {
		if k, ok := names[g]; ok {
			return k
		}
		return g
	}
	holders := map[string]string{}
	for g, in := range held {
		holders[canon(g)] = in
	}
	for i, g := range c.GPUs {
		if _, ok := names[g]; names != nil && !ok {
			return fmt.Sprintf("GPU %s not on the host (by index or UUID of its inventory)", g), fmt.Sprintf("spec.container.gpus[%d]", i)
		}
		if in := holders[canon(g)]; in != "" {
			return fmt.Sprintf("GPU %s is held by instance %s", g, in), ""
		}
	}
	return "", ""
}
