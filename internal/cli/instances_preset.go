package cli

import (
	"errors"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preset"
)

// presetRequest builds a create request from --preset and its flags; the
// control plane expands it (internal/wire/preset).
func (c *InstancesCreateCmd) presetRequest(req api.CreateInstanceRequest) (api.CreateInstanceRequest, error) {
	if c.Preset == "" {
		return req, errors.New("--model, --port, --tensor-parallel and --max-model-len go with --preset vllm|ollama")
	}
	if c.Spec != "" || c.ImageURL != "" || c.ImageSHA256 != "" || c.KernelURL != "" || c.InitrdURL != "" || c.Cmdline != "" ||
		c.DiskGiB != 0 || len(c.Slot) > 0 || len(c.Forward) > 0 || c.ReadyMarker != "" || c.ReadyPort != 0 ||
		len(c.SSHKey) > 0 || c.User != "" {
		return req, errors.New("--preset replaces --spec and the VM flags (only --vcpus, --memory-mib and --gpus go with it)")
	}
	req.Preset = &api.PresetRequest{Name: c.Preset, Model: c.Model, Port: c.Port, GPUs: preset.ParseGPUs(c.GPUs),
		TensorParallelSize: c.TensorPar, MaxModelLen: c.MaxModelLen, VCPUs: c.VCPUs, MemoryMiB: c.MemoryMiB}
	return req, nil
}
