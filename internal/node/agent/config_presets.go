package agent

import (
	"errors"
	"flag"
	"fmt"
	"strconv"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/preset"
)

// LocalWorkloads are seed 003's inference flags: -enable-vllm and
// -enable-ollama declare servers this host runs. The agent reports them in
// its capabilities (local_workloads) and the control plane keeps an
// instance <host>-vllm / <host>-ollama pinned here for each, run by the
// reconciler like any other (docs/adr/0009-local-workloads.md).
type LocalWorkloads struct {
	EnableVLLM         bool   // NODE_AGENT_ENABLE_VLLM
	VLLMModel          string // NODE_AGENT_VLLM_MODEL
	VLLMPort           int    // NODE_AGENT_VLLM_PORT
	VLLMGPUs           string // NODE_AGENT_VLLM_GPUS: all | none | indices or UUIDs, comma-separated
	VLLMTensorParallel int    // NODE_AGENT_VLLM_TENSOR_PARALLEL
	VLLMMaxModelLen    int    // NODE_AGENT_VLLM_MAX_MODEL_LEN
	EnableOllama       bool   // NODE_AGENT_ENABLE_OLLAMA
	OllamaModel        string // NODE_AGENT_OLLAMA_MODEL
	OllamaPort         int    // NODE_AGENT_OLLAMA_PORT
	OllamaGPUs         string // NODE_AGENT_OLLAMA_GPUS
}

// DefaultLocalWorkloads are seed 003's defaults (none enabled).
func DefaultLocalWorkloads() LocalWorkloads {
	return LocalWorkloads{VLLMModel: preset.VLLMModel, VLLMPort: preset.VLLMPort, VLLMGPUs: api.GPUsAll,
		VLLMTensorParallel: preset.VLLMTensorPar, VLLMMaxModelLen: preset.VLLMMaxModelLen,
		OllamaModel: preset.OllamaModel, OllamaPort: preset.OllamaPort, OllamaGPUs: api.GPUsAll}
}

// presetStringKeys are the plain string keys of the local workloads.
func (c *Config) presetStringKeys() map[string]*string {
	w := &c.Local
	return map[string]*string{"NODE_AGENT_VLLM_MODEL": &w.VLLMModel, "NODE_AGENT_VLLM_GPUS": &w.VLLMGPUs,
		"NODE_AGENT_OLLAMA_MODEL": &w.OllamaModel, "NODE_AGENT_OLLAMA_GPUS": &w.OllamaGPUs}
}

// presetBoolKeys and presetIntKeys are the other ones.
func (c *Config) presetBoolKeys() map[string]*bool {
	return map[string]*bool{"NODE_AGENT_ENABLE_VLLM": &c.Local.EnableVLLM, "NODE_AGENT_ENABLE_OLLAMA": &c.Local.EnableOllama}
}

func (c *Config) presetIntKeys() map[string]*int {
	w := &c.Local
	return map[string]*int{"NODE_AGENT_VLLM_PORT": &w.VLLMPort, "NODE_AGENT_VLLM_TENSOR_PARALLEL": &w.VLLMTensorParallel,
		"NODE_AGENT_VLLM_MAX_MODEL_LEN": &w.VLLMMaxModelLen, "NODE_AGENT_OLLAMA_PORT": &w.OllamaPort}
}

// presetNumericKeys are the bool and int keys (numericKeys has them).
func presetNumericKeys() []string {
	var c Config
	var out []string
	for k := range c.presetBoolKeys() {
		out = append(out, k)
	}
	for k := range c.presetIntKeys() {
		out = append(out, k)
	}
	return out
}

// presetKind is a local workload key's kind ("" for another key).
func (c Config) presetKind(key string) string {
	if _, ok := c.presetBoolKeys()[key]; ok {
		return kindBool
	}
	if _, ok := c.presetIntKeys()[key]; ok {
		return kindInt
	}
	return ""
}

// setPresetKey sets a bool or int local workload key; ok is false for
// another key.
func (c *Config) setPresetKey(key, val string) (ok bool, err error) {
	if p, ok := c.presetBoolKeys()[key]; ok {
		b, err := strconv.ParseBool(val)
		if err != nil {
			return true, fmt.Errorf("%s %q: must be true or false", key, val)
		}
		*p = b
		return true, nil
	}
	if p, ok := c.presetIntKeys()[key]; ok {
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return true, fmt.Errorf("%s %q: must be a whole number >= 0", key, val)
		}
		*p = n
		return true, nil
	}
	return false, nil
}

// presetValue is a bool or int key's value as text ("" for another key).
func (c Config) presetValue(key string) string {
	if p, ok := c.presetBoolKeys()[key]; ok {
		return strconv.FormatBool(*p)
	}
	if p, ok := c.presetIntKeys()[key]; ok {
		return strconv.Itoa(*p)
	}
	return ""
}

// definePresetFlags defines seed 003's flags.
func definePresetFlags(fs *flag.FlagSet, f *Config) {
	w, d := &f.Local, DefaultLocalWorkloads()
	fs.BoolVar(&w.EnableVLLM, "enable-vllm", false, "run a vLLM server (OpenAI-compatible) on this host as instance <host>-vllm")
	fs.StringVar(&w.VLLMModel, "vllm-model", "", "vLLM model (default "+d.VLLMModel+")")
	fs.IntVar(&w.VLLMPort, "vllm-port", 0, fmt.Sprintf("vLLM API port (default %d)", d.VLLMPort))
	fs.StringVar(&w.VLLMGPUs, "vllm-gpus", "", "vLLM GPU devices: all, or indices/UUIDs such as 0,1 (default all)")
	fs.IntVar(&w.VLLMTensorParallel, "vllm-tensor-parallel", 0, fmt.Sprintf("vLLM tensor parallel size (default %d)", d.VLLMTensorParallel))
	fs.IntVar(&w.VLLMMaxModelLen, "vllm-max-model-len", 0, fmt.Sprintf("vLLM max model length (default %d)", d.VLLMMaxModelLen))
	fs.BoolVar(&w.EnableOllama, "enable-ollama", false, "run an Ollama server on this host as instance <host>-ollama")
	fs.StringVar(&w.OllamaModel, "ollama-model", "", "Ollama model, pulled after start (default "+d.OllamaModel+")")
	fs.IntVar(&w.OllamaPort, "ollama-port", 0, fmt.Sprintf("Ollama API port (default %d)", d.OllamaPort))
	fs.StringVar(&w.OllamaGPUs, "ollama-gpus", "", "Ollama GPU devices: all, none, or indices/UUIDs such as 0,1 (default all)")
}

// Requests are the declared workloads as preset input (the capabilities'
// local_workloads), vLLM first.
func (w LocalWorkloads) Requests() []api.PresetRequest {
	var out []api.PresetRequest
	if w.EnableVLLM {
		out = append(out, api.PresetRequest{Name: api.PresetVLLM, Model: w.VLLMModel, Port: w.VLLMPort,
			GPUs: preset.ParseGPUs(w.VLLMGPUs), TensorParallelSize: w.VLLMTensorParallel, MaxModelLen: w.VLLMMaxModelLen})
	}
	if w.EnableOllama {
		out = append(out, api.PresetRequest{Name: api.PresetOllama, Model: w.OllamaModel, Port: w.OllamaPort,
			GPUs: preset.ParseGPUs(w.OllamaGPUs)})
	}
	return out
}

// validateLocal checks the enabled workloads as the control plane will
// expand them, naming the keys; they need the docker runtime.
func (c Config) validateLocal() []error {
	w := c.Local
	var errs []error
	if len(w.Requests()) > 0 && c.ContainerRuntime != "docker" && c.Runtime != "docker" {
		errs = append(errs, errors.New("NODE_AGENT_ENABLE_VLLM / NODE_AGENT_ENABLE_OLLAMA: the servers run as containers: set NODE_AGENT_CONTAINER_RUNTIME=docker (-container-runtime docker)"))
	}
	if w.EnableVLLM && w.EnableOllama && w.VLLMPort == w.OllamaPort {
		errs = append(errs, fmt.Errorf("NODE_AGENT_VLLM_PORT and NODE_AGENT_OLLAMA_PORT are both %d", w.VLLMPort))
	}
	key := map[string]string{"model": "MODEL", "port": "PORT", "gpus": "GPUS", "tensor_parallel_size": "TENSOR_PARALLEL",
		"max_model_len": "MAX_MODEL_LEN"}
	for _, r := range w.Requests() {
		if _, fe := preset.Expand(r, ""); len(fe) > 0 {
			for _, e := range fe {
				name := key[e.Field]
				if name == "" {
					name = "GPUS" // gpus[i]
				}
				errs = append(errs, fmt.Errorf("NODE_AGENT_%s_%s: %s", map[string]string{"vllm": "VLLM", "ollama": "OLLAMA"}[r.Name], name, e.Message))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return []error{errors.Join(errs...)}
}
