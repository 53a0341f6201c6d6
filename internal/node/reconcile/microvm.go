package reconcile

import (
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// microVMSpec is ToRuntimeSpec for a microVM (spec.runtime "microvm"): an
// OCI image (container.image) or a root filesystem artifact (image), the
// container section's command, args, env, registry credentials and named
// volumes (with their size and format), and a VM section that says
// MicroVM (the Router sends it to the VM runtime).
func microVMSpec(d api.DesiredInstance, secrets map[string][]byte) runtime.Spec {
	s := d.Spec
	c := s.Container
	if c == nil {
		c = &api.ContainerSpec{}
	}
	img := runtime.DiskImage(s.Image)
	if c.Image != "" {
		img = runtime.Image{Kind: runtime.ImageOCI, Ref: c.Image, Digest: c.Digest}
	}
	var cs *runtime.ContainerSpec
	if c.RegistryAuth != "" {
		cs = &runtime.ContainerSpec{RegistryAuth: c.RegistryAuth}
	}
	var vols []runtime.Volume // named volumes, created on first use
	for _, v := range c.Volumes {
		vols = append(vols, runtime.Volume{Source: v.Source, Target: v.Target, ReadOnly: v.ReadOnly, SizeGiB: v.SizeGiB, Format: v.Format})
	}
	return runtime.Spec{
		ID:        d.ID,
		Owner:     Owner,
		Image:     img,
		Command:   c.Command,
		Args:      c.Args,
		Env:       c.Env,
		Ports:     s.Network.Forwards,
		Volumes:   vols,
		Resources: runtime.Resources{VCPUs: s.VCPUs, MemoryMiB: s.MemoryMiB, DiskGiB: s.DiskGiB},
		Readiness: runtime.Readiness{Readiness: s.Readiness, HealthCheck: s.HealthCheck},
		Secrets:   secrets,
		Container: cs,
		VM: &runtime.VMSpec{MicroVM: true,
			Network: runtime.VMNetwork{Mode: s.Network.Mode, Bridge: s.Network.Bridge, MAC: s.Network.MAC}},
	}
}
