package api

// Preset names (PresetRequest.Name): internal/wire/preset expands them.
const (
	PresetVLLM   = "vllm"
	PresetOllama = "ollama"
)

// GPUsNone in PresetRequest.GPUs runs a preset without GPUs (Ollama on
// CPU; vLLM refuses it).
const GPUsNone = "none"

// PresetRequest is the short spec of an inference server that a preset
// turns into a full container InstanceSpec (internal/wire/preset.Expand):
// POST /api/v1/instances's preset, a host's declared local workloads
// (Capabilities.LocalWorkloads), and InstanceSpec.Preset, the input an
// expanded spec came from. Zero fields take the preset's defaults.
type PresetRequest struct {
	Name  string `json:"name"`            // "vllm" or "ollama"
	Model string `json:"model,omitempty"` // vLLM: a Hugging Face model id; Ollama: a model name (pulled after start)
	Image string `json:"image,omitempty"` // overrides the preset's pinned image
	Port  int    `json:"port,omitempty"`  // the server's port in the container, forwarded on the host's 127.0.0.1
	// GPUs by index or UUID, ["all"] (the default) or ["none"].
	GPUs               []string `json:"gpus,omitempty"`
	TensorParallelSize int      `json:"tensor_parallel_size,omitempty"` // vLLM only
	MaxModelLen        int      `json:"max_model_len,omitempty"`        // vLLM only
	VCPUs              int      `json:"vcpus,omitempty"`
	MemoryMiB          int      `json:"memory_mib,omitempty"`
	// HFTokenSecret names a secret holding a Hugging Face token (vLLM,
	// gated models): mounted as a file and named by HF_TOKEN_PATH.
	HFTokenSecret string `json:"hf_token_secret,omitempty"`
}
