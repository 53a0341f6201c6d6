// Package preset turns the short spec of an inference server (an
// api.PresetRequest: vLLM or Ollama) into the full container
// api.InstanceSpec the docker runtime runs. It is pure: the control plane
// expands an operator's preset and a host's declared local workloads with
// it, the agent validates its -enable-vllm / -enable-ollama flags with it,
// and the CLI parses --gpus with it.
package preset

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Pinned images: a release of each server's official image, overridable
// by PresetRequest.Image. Not pulled by this repository's tests.
const (
	VLLMImage   = "vllm/vllm-openai:v0.8.5"
	OllamaImage = "ollama/ollama:0.6.8"
)

// Defaults (seed 003's agent flags).
const (
	VLLMModel        = "mistralai/Mistral-7B-Instruct-v0.1"
	VLLMPort         = 8000
	VLLMTensorPar    = 1
	VLLMMaxModelLen  = 4096
	VLLMVCPUs        = 4
	VLLMMemoryMiB    = 16384
	VLLMShmMiB       = 4096
	OllamaModel      = "llama2"
	OllamaPort       = 11434
	OllamaVCPUs      = 4
	OllamaMemoryMiB  = 8192
	HFCacheVolume    = "drover-hf-cache"
	HFCacheTarget    = "/root/.cache/huggingface"
	OllamaVolume     = "drover-ollama"
	OllamaTarget     = "/root/.ollama"
	secretsDir       = "/run/drover/secrets"
	maxModelLen      = 1 << 24
	maxModelNameLen  = 256
	maxTensorPar     = 64
	vllmReadyTimeout = 30 * time.Minute // a first start downloads the weights
	ollamaReadyWait  = 5 * time.Minute
	healthInterval   = 30 * time.Second
	healthFailures   = 3
	forwardName      = "api"
)

// Names are the presets Expand knows.
func Names() []string { return []string{api.PresetVLLM, api.PresetOllama} }

// ParseGPUs splits a --gpus / -vllm-gpus value ("all", "none", "0,1",
// "GPU-…") into PresetRequest.GPUs; "" is nil (the preset's default, all).
func ParseGPUs(s string) []string {
	var out []string
	for _, g := range strings.Split(s, ",") {
		if g = strings.TrimSpace(g); g != "" {
			out = append(out, g)
		}
	}
	return out
}

// WithDefaults is in with every zero field set to its preset's default
// (the stored, displayed form). An unknown preset is returned unchanged.
func WithDefaults(in api.PresetRequest) api.PresetRequest {
	var model, image string
	var port, vcpus, mem int
	switch in.Name {
	case api.PresetVLLM:
		model, image, port, vcpus, mem = VLLMModel, VLLMImage, VLLMPort, VLLMVCPUs, VLLMMemoryMiB
		if in.TensorParallelSize == 0 {
			in.TensorParallelSize = VLLMTensorPar
		}
		if in.MaxModelLen == 0 {
			in.MaxModelLen = VLLMMaxModelLen
		}
	case api.PresetOllama:
		model, image, port, vcpus, mem = OllamaModel, OllamaImage, OllamaPort, OllamaVCPUs, OllamaMemoryMiB
	default:
		return in
	}
	if in.Model == "" {
		in.Model = model
	}
	if in.Image == "" {
		in.Image = image
	}
	if in.Port == 0 {
		in.Port = port
	}
	if len(in.GPUs) == 0 {
		in.GPUs = []string{api.GPUsAll}
	}
	if in.VCPUs == 0 {
		in.VCPUs = vcpus
	}
	if in.MemoryMiB == 0 {
		in.MemoryMiB = mem
	}
	in.GPUs = slices.Clone(in.GPUs)
	return in
}

// NeedsGPU reports whether the expanded preset asks for GPUs (then a host
// reporting none cannot run it), and how many at least (the tensor
// parallel size, or the GPUs named).
func NeedsGPU(in api.PresetRequest) (bool, int) {
	in = WithDefaults(in)
	switch {
	case slices.Contains(in.GPUs, api.GPUsNone):
		return false, 0
	case slices.Contains(in.GPUs, api.GPUsAll):
		return true, max(1, in.TensorParallelSize)
	}
	return len(in.GPUs) > 0, len(in.GPUs)
}

// Expand validates in and returns the full container spec. Field errors
// are named "<prefix>.<field>" (prefix "preset"; "" for none).
func Expand(in api.PresetRequest, prefix string) (api.InstanceSpec, []api.FieldError) {
	f := &errs{prefix: prefix}
	if !slices.Contains(Names(), in.Name) {
		f.add("name", "must be one of %s", strings.Join(Names(), ", "))
		return api.InstanceSpec{}, f.list
	}
	in = WithDefaults(in)
	validate(f, in)
	if len(f.list) > 0 {
		return api.InstanceSpec{}, f.list
	}
	gpus := in.GPUs
	if slices.Contains(gpus, api.GPUsNone) {
		gpus = nil
	}
	c := &api.ContainerSpec{Image: in.Image, GPUs: gpus}
	s := api.InstanceSpec{
		Runtime: api.RuntimeDocker, Container: c, VCPUs: in.VCPUs, MemoryMiB: in.MemoryMiB,
		Network:     api.NetworkSpec{Forwards: []api.PortForward{{Name: forwardName, GuestPort: in.Port, HostPort: in.Port}}},
		HealthCheck: &api.HealthCheck{Interval: api.Duration(healthInterval), FailureThreshold: healthFailures},
	}
	if slices.Contains(gpus, api.GPUsAll) {
		_, s.GPUs = NeedsGPU(in) // "all" holds at least this many for placement
	}
	stored := in
	s.Preset = &stored
	switch in.Name {
	case api.PresetVLLM:
		c.Args = []string{"--model", in.Model, "--tensor-parallel-size", strconv.Itoa(in.TensorParallelSize),
			"--max-model-len", strconv.Itoa(in.MaxModelLen), "--port", strconv.Itoa(in.Port)}
		c.Volumes = []api.VolumeMount{{Source: HFCacheVolume, Target: HFCacheTarget}}
		c.ShmSizeMiB = min(VLLMShmMiB, in.MemoryMiB/2)
		s.Readiness = api.Readiness{TCPPort: in.Port, HTTPPath: "/health", Timeout: api.Duration(vllmReadyTimeout)}
		if in.HFTokenSecret != "" {
			c.Env = map[string]string{"HF_TOKEN_PATH": secretsDir + "/" + in.HFTokenSecret}
			s.Secrets = []string{in.HFTokenSecret}
		}
	case api.PresetOllama:
		c.Env = map[string]string{"OLLAMA_HOST": "0.0.0.0:" + strconv.Itoa(in.Port)}
		c.Volumes = []api.VolumeMount{{Source: OllamaVolume, Target: OllamaTarget}}
		s.Readiness = api.Readiness{TCPPort: in.Port, HTTPPath: "/api/tags", Timeout: api.Duration(ollamaReadyWait)}
	}
	return s, nil
}

// validate checks a preset input with its defaults applied.
func validate(f *errs, in api.PresetRequest) {
	if strings.TrimSpace(in.Model) == "" || len(in.Model) > maxModelNameLen || strings.ContainsAny(in.Model, " \t\r\n\x00") {
		f.add("model", "must be a model name of at most %d characters without spaces", maxModelNameLen)
	}
	if strings.ContainsAny(in.Image, " \t\r\n@") || len(in.Image) > 255 {
		f.add("image", "must be an image reference such as registry.example/repo:tag")
	}
	if in.Port < 1 || in.Port > 65535 {
		f.add("port", "must be 1..65535")
	}
	if in.VCPUs < 0 {
		f.add("vcpus", "must be >= 1 (0: the preset's default)")
	}
	if in.MemoryMiB < 0 || (in.MemoryMiB > 0 && in.MemoryMiB < 256) {
		f.add("memory_mib", "must be at least 256 (0: the preset's default)")
	}
	for i, g := range in.GPUs {
		special := g == api.GPUsAll || g == api.GPUsNone
		if g == "" || strings.ContainsAny(g, ", \t") || (special && len(in.GPUs) > 1) {
			f.add(fmt.Sprintf("gpus[%d]", i), `must be a GPU index or UUID, or "all" or "none" alone`)
		}
	}
	if in.HFTokenSecret != "" && (in.HFTokenSecret != strings.Trim(in.HFTokenSecret, "./") ||
		strings.ContainsAny(in.HFTokenSecret, "/\\\x00 ")) {
		f.add("hf_token_secret", "must be a plain secret name")
	}
	switch in.Name {
	case api.PresetVLLM:
		if slices.Contains(in.GPUs, api.GPUsNone) {
			f.add("gpus", "vllm needs at least one GPU (its image is CUDA-only)")
		}
		switch tp := in.TensorParallelSize; {
		case tp < 1 || tp > maxTensorPar:
			f.add("tensor_parallel_size", "must be 1..%d", maxTensorPar)
		case !slices.Contains(in.GPUs, api.GPUsAll) && !slices.Contains(in.GPUs, api.GPUsNone) && tp > len(in.GPUs):
			f.add("tensor_parallel_size", "%d is more than the %d GPUs given (each tensor-parallel rank needs a GPU)", tp, len(in.GPUs))
		}
		if in.MaxModelLen < 1 || in.MaxModelLen > maxModelLen {
			f.add("max_model_len", "must be 1..%d", maxModelLen)
		}
	case api.PresetOllama:
		if in.TensorParallelSize > 1 {
			f.add("tensor_parallel_size", "is a vllm setting (Ollama splits a model over its GPUs itself)")
		}
		if in.MaxModelLen != 0 {
			f.add("max_model_len", "is a vllm setting")
		}
		if in.HFTokenSecret != "" {
			f.add("hf_token_secret", "is a vllm setting")
		}
	}
}

// errs collects field errors under a prefix.
type errs struct {
	prefix string
	list   []api.FieldError
}

func (f *errs) add(field, format string, args ...any) {
	if f.prefix != "" {
		field = f.prefix + "." + field
	}
	f.list = append(f.list, api.FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}
