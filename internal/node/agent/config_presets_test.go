package agent_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/drover-dev/drover/internal/node/agent"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// presetRuntimes register docker, which the local workloads need.
var presetRuntimes = noderuntime.Registry{mock.Name: mock.Entry(), docker.Name: docker.Entry()}

func loadPresetConfig(args []string, getenv func(string) string) (agent.Config, error) {
	base := []string{"-control-plane-url", "https://cp.example:8443", "-runtime", "mock", "-container-runtime", "docker"}
	return agent.LoadConfig(append(base, args...), getenv, presetRuntimes, agent.WithDefaultEnvFile(""))
}

// TestLocalWorkloadFlags: seed 003's flags work as written with its
// defaults, from flags, the environment and a TOML file alike.
func TestLocalWorkloadFlags(t *testing.T) {
	all := []string{api.GPUsAll}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		file string
		want []api.PresetRequest
	}{
		{"none enabled", nil, nil, "", nil},
		{"seed defaults", []string{"--enable-vllm", "--enable-ollama"}, nil, "", []api.PresetRequest{
			{Name: "vllm", Model: "mistralai/Mistral-7B-Instruct-v0.1", Port: 8000, GPUs: all, TensorParallelSize: 1, MaxModelLen: 4096},
			{Name: "ollama", Model: "llama2", Port: 11434, GPUs: all}}},
		{"seed example", []string{"-enable-vllm", "-vllm-model", "org/m", "-vllm-gpus", "0,1", "-vllm-tensor-parallel", "2",
			"-vllm-max-model-len", "8192", "-vllm-port", "8001"}, nil, "", []api.PresetRequest{
			{Name: "vllm", Model: "org/m", Port: 8001, GPUs: []string{"0", "1"}, TensorParallelSize: 2, MaxModelLen: 8192}}},
		{"environment", nil, map[string]string{"NODE_AGENT_ENABLE_OLLAMA": "true", "NODE_AGENT_OLLAMA_GPUS": "none",
			"NODE_AGENT_OLLAMA_MODEL": "llama3.2:1b"}, "", []api.PresetRequest{
			{Name: "ollama", Model: "llama3.2:1b", Port: 11434, GPUs: []string{"none"}}}},
		{"toml", nil, nil, "enable_ollama = true\nollama_port = 11500\nollama_gpus = \"1\"\n", []api.PresetRequest{
			{Name: "ollama", Model: "llama2", Port: 11500, GPUs: []string{"1"}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				p := filepath.Join(t.TempDir(), "agent.toml")
				if err := os.WriteFile(p, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "-config", p)
			}
			c, err := loadPresetConfig(args, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			if diff := cmp.Diff(tc.want, c.Local.Requests()); diff != "" {
				t.Errorf("local workloads (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLocalWorkloadErrors: bad values are refused at start, naming the key.
func TestLocalWorkloadErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"-enable-vllm", "-vllm-gpus", "0", "-vllm-tensor-parallel", "2"}, "NODE_AGENT_VLLM_TENSOR_PARALLEL"},
		{[]string{"-enable-vllm", "-vllm-gpus", "none"}, "NODE_AGENT_VLLM_GPUS"},
		{[]string{"-enable-ollama", "-ollama-port", "70000"}, "NODE_AGENT_OLLAMA_PORT"},
		{[]string{"-enable-vllm", "-enable-ollama", "-vllm-port", "9000", "-ollama-port", "9000"}, "both 9000"},
		{[]string{"-vllm-port", "x"}, "vllm-port"},
	}
	for _, tc := range cases {
		if _, err := loadPresetConfig(tc.args, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
	_, err := agent.LoadConfig([]string{"-control-plane-url", "https://cp:8443", "-runtime", "mock", "-enable-ollama"},
		func(string) string { return "" }, presetRuntimes, agent.WithDefaultEnvFile(""))
	if err == nil || !strings.Contains(err.Error(), "NODE_AGENT_CONTAINER_RUNTIME=docker") {
		t.Errorf("without a container runtime: %v", err)
	}
	keys := agent.ConfigKeys(presetRuntimes)
	for _, k := range []string{"NODE_AGENT_ENABLE_VLLM", "NODE_AGENT_VLLM_MAX_MODEL_LEN", "NODE_AGENT_OLLAMA_GPUS"} {
		if !slices.ContainsFunc(keys, func(ck agent.ConfigKey) bool { return ck.Key == k && ck.Flag != "" }) {
			t.Errorf("ConfigKeys lacks %s with its flag", k)
		}
	}
}
