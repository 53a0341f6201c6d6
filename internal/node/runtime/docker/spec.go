package docker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pattern"
)

// ErrInvalidSpec is wrapped by every spec validation failure (inside a
// *runtime.Error whose message starts with the field's name).
var ErrInvalidSpec = errors.New("invalid spec")

var (
	digestRE     = pattern.Must(`^sha256:[0-9a-f]{64}$`, `^sha256:[0-9a-f]*$`, 71, 71)
	volumeNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	secretRE     = pattern.Must(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`, `^[A-Za-z0-9][A-Za-z0-9_.-]*$`, 1, 128)
	ulimitNames  = []string{"nofile", "nproc"}
)

// invalid is a field error of spec validation.
func invalid(reason api.ReasonCode, id, field, format string, args ...any) *runtime.Error {
	return &runtime.Error{Reason: reason, Op: "create", ID: id,
		Err: fmt.Errorf("%w: %s: %s", ErrInvalidSpec, field, fmt.Sprintf(format, args...))}
}

// validate checks what a container can run; it does no I/O.
func (r *Runtime) validate(s runtime.Spec) error {
	id, bad := s.ID, api.ReasonContainerStartFailed
	if !runtime.ValidID(id) {
		return invalid(bad, id, "spec.id", "%q: want 1-63 of [a-z0-9_-], starting with a letter or digit", id)
	}
	if !s.Image.IsOCI() || s.Image.Ref == "" {
		return invalid(api.ReasonImagePullFailed, id, "spec.image", "the docker runtime runs OCI images (kind oci with a ref)")
	}
	if d := s.Image.Digest; d != "" && !digestRE.MatchString(d) {
		return invalid(api.ReasonImagePullFailed, id, "spec.container.digest", "%q: want sha256:<64 lowercase hex>", d)
	}
	if s.VM != nil {
		return invalid(bad, id, "spec.vm", "a container has no VM section")
	}
	if len(s.Devices.PCI) > 0 {
		return invalid(bad, id, "spec.devices.pci", "PCI passthrough needs a VM runtime")
	}
	if s.Resources.VCPUs < 0 || s.Resources.MemoryMiB < 0 {
		return invalid(bad, id, "spec.resources", "vcpus and memory_mib must not be negative")
	}
	if s.Resources.MemoryMiB > 0 && s.Resources.MemoryMiB < 6 {
		return invalid(bad, id, "spec.memory_mib", "%d: the engine needs at least 6 MiB", s.Resources.MemoryMiB)
	}
	for i, v := range s.Volumes {
		if err := r.validateVolume(id, i, v); err != nil {
			return err
		}
	}
	for i, p := range s.Ports {
		if p.GuestPort < 1 || p.GuestPort > 65535 || p.HostPort < 0 || p.HostPort > 65535 {
			return invalid(api.ReasonNetworkSetupFailed, id, fmt.Sprintf("spec.network.forwards[%d]", i), "ports must be 1-65535 (host 0: the engine picks)")
		}
		if r.opts.Network == "host" && p.HostPort != 0 && p.HostPort != p.GuestPort {
			return invalid(api.ReasonNetworkSetupFailed, id, fmt.Sprintf("spec.network.forwards[%d].host_port", i), "with host networking a port is the container's own (%d)", p.GuestPort)
		}
	}
	if rd := s.Readiness; rd.SerialMarker != "" {
		return invalid(bad, id, "spec.readiness.serial_marker", "a container has no serial console: use tcp_port (and http_path)")
	} else if rd.HTTPPath != "" && (rd.TCPPort == 0 || !strings.HasPrefix(rd.HTTPPath, "/")) {
		return invalid(bad, id, "spec.readiness.http_path", "%q: needs tcp_port and a path starting with /", rd.HTTPPath)
	}
	for name := range s.Secrets {
		if !secretRE.MatchString(name) {
			return invalid(api.ReasonSecretsInjectionFailed, id, "spec.secrets", "%q: not a plain file name", name)
		}
	}
	for name, v := range s.ContainerOrZero().Ulimits {
		if !slices.Contains(ulimitNames, name) || v < 0 {
			return invalid(bad, id, "spec.container.ulimits", "%s=%d: want nofile or nproc, not negative", name, v)
		}
	}
	return r.validateGPUs(id, s.Devices.GPUs)
}

// validateVolume allows a named volume, or a host path under AllowedDirs.
func (r *Runtime) validateVolume(id string, i int, v runtime.Volume) error {
	field := fmt.Sprintf("spec.container.volumes[%d]", i)
	if !filepath.IsAbs(v.Target) {
		return invalid(api.ReasonVolumeAttachFailed, id, field+".target", "%q: want an absolute path", v.Target)
	}
	if v.Target == SecretsTarget || strings.HasPrefix(v.Target, SecretsTarget+"/") {
		return invalid(api.ReasonVolumeAttachFailed, id, field+".target", "%s is the secrets mount", SecretsTarget)
	}
	if v.SizeGiB != 0 || v.Format != "" {
		// The engine's named volumes have no size or format to give:
		// those are a microVM's volumes' (runtime microvm).
		return invalid(api.ReasonVolumeAttachFailed, id, field, "size_gib and format are for microVM volumes; a container's named volume is the engine's")
	}
	if !filepath.IsAbs(v.Source) {
		if !volumeNameRE.MatchString(v.Source) {
			return invalid(api.ReasonVolumeAttachFailed, id, field+".source", "%q: want a volume name or an absolute host path", v.Source)
		}
		return nil
	}
	clean := filepath.Clean(v.Source)
	for _, d := range r.opts.AllowedDirs {
		d = filepath.Clean(d)
		if clean == d || strings.HasPrefix(clean, d+string(filepath.Separator)) {
			return nil
		}
	}
	return invalid(api.ReasonVolumeAttachFailed, id, field+".source",
		"host path %q is not under the allowed volume directories [%s] (NODE_AGENT_DOCKER_VOLUME_DIRS)", v.Source, strings.Join(r.opts.AllowedDirs, ", "))
}

// validateGPUs refuses a GPU the host did not discover.
func (r *Runtime) validateGPUs(id string, gpus []string) error {
	if len(gpus) == 0 {
		return nil
	}
	if slices.Contains(gpus, api.GPUsAll) {
		if len(gpus) > 1 {
			return invalid(api.ReasonContainerStartFailed, id, "spec.container.gpus", `"all" stands alone`)
		}
		return nil
	}
	if r.opts.GPUs == nil {
		return nil
	}
	known := map[string]bool{}
	for _, g := range r.opts.GPUs() {
		if g.UUID != "" {
			known[g.UUID] = true
		}
		if g.Index != nil {
			known[strconv.Itoa(*g.Index)] = true
		}
	}
	for i, g := range gpus {
		if !known[g] {
			return invalid(api.ReasonContainerStartFailed, id, fmt.Sprintf("spec.container.gpus[%d]", i),
				"%q: no such GPU on this host (by index or UUID; the host inventory lists %d)", g, len(known))
		}
	}
	return nil
}

// specJSON is the spec's identity: its JSON (no secrets: runtime.Spec
// does not encode them).
func specJSON(s runtime.Spec) ([]byte, error) {
	s.Secrets = nil
	return json.Marshal(s)
}

// specHash is the label value that tells two specs apart.
func specHash(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// engineSpec is what the engine is asked to create.
type engineSpec struct {
	config *container.Config
	host   *container.HostConfig
}

// toEngine turns a validated spec into the engine's create request; image
// is what to run (the pulled image's id), secretsDir the instance's
// secrets tmpfs ("" when it has none).
func (r *Runtime) toEngine(s runtime.Spec, image, secretsDir string, specBytes []byte) (engineSpec, error) {
	cfg := &container.Config{
		Image:      image,
		Entrypoint: s.Command,
		Cmd:        s.Args,
		Labels: map[string]string{LabelInstance: s.ID, LabelOwner: s.Owner,
			LabelSpecHash: specHash(specBytes), LabelSpec: string(specBytes)},
		ExposedPorts: network.PortSet{},
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cfg.Env = append(cfg.Env, k+"="+s.Env[k])
	}
	hc := &container.HostConfig{NetworkMode: container.NetworkMode(r.opts.Network)}
	if r.opts.Network != "host" {
		hc.PortBindings = network.PortMap{}
		ports := slices.Clone(s.Ports)
		if tp := s.Readiness.TCPPort; tp > 0 && !slices.ContainsFunc(ports, func(p api.PortForward) bool { return p.GuestPort == tp }) {
			ports = append(ports, api.PortForward{Name: "readiness", GuestPort: tp}) // published so the agent can reach it
		}
		for _, p := range ports {
			port, err := network.ParsePort(strconv.Itoa(p.GuestPort) + "/tcp")
			if err != nil {
				return engineSpec{}, invalid(api.ReasonNetworkSetupFailed, s.ID, "spec.network.forwards", "%v", err)
			}
			cfg.ExposedPorts[port] = struct{}{}
			hp := ""
			if p.HostPort > 0 {
				hp = strconv.Itoa(p.HostPort)
			}
			hc.PortBindings[port] = append(hc.PortBindings[port], network.PortBinding{HostIP: netip.AddrFrom4([4]byte{127, 0, 0, 1}), HostPort: hp})
		}
	}
	if s.Resources.VCPUs > 0 {
		hc.NanoCPUs = int64(s.Resources.VCPUs) * 1e9
	}
	if s.Resources.MemoryMiB > 0 {
		hc.Memory = int64(s.Resources.MemoryMiB) << 20
		hc.MemorySwap = hc.Memory // no swap beyond the limit: over it is an OOM kill
	}
	for _, v := range s.Volumes {
		m := mount.Mount{Type: mount.TypeVolume, Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly}
		if filepath.IsAbs(v.Source) {
			m.Type = mount.TypeBind
		}
		hc.Mounts = append(hc.Mounts, m)
	}
	if secretsDir != "" {
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: secretsDir, Target: SecretsTarget, ReadOnly: true})
	}
	lim := map[string]int64{}
	for k, v := range r.opts.Ulimits {
		if v > 0 {
			lim[k] = v
		}
	}
	for k, v := range s.ContainerOrZero().Ulimits {
		if v > 0 {
			lim[k] = v
		}
	}
	for _, name := range ulimitNames {
		if v, ok := lim[name]; ok {
			hc.Ulimits = append(hc.Ulimits, &container.Ulimit{Name: name, Soft: v, Hard: v})
		}
	}
	if n := s.ContainerOrZero().ShmSizeMiB; n > 0 {
		hc.ShmSize = int64(n) << 20
	}
	r.gpuRequest(s.Devices.GPUs, hc)
	return engineSpec{config: cfg, host: hc}, nil
}

// gpuRequest asks for GPUs the engine's way: Docker takes an NVIDIA device
// request (IDs, or count -1 for all), Podman CDI device names.
func (r *Runtime) gpuRequest(gpus []string, hc *container.HostConfig) {
	if len(gpus) == 0 {
		return
	}
	if r.engine.Name == "podman" {
		for _, g := range gpus {
			hc.Devices = append(hc.Devices, container.DeviceMapping{PathOnHost: "nvidia.com/gpu=" + g})
		}
		return
	}
	req := container.DeviceRequest{Driver: "nvidia", Capabilities: [][]string{{"gpu"}}}
	if slices.Contains(gpus, api.GPUsAll) {
		req.Count = -1
	} else {
		req.DeviceIDs = slices.Clone(gpus)
	}
	hc.DeviceRequests = append(hc.DeviceRequests, req)
}
