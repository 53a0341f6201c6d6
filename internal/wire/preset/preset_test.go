package preset

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json")

// TestExpandGolden: each preset's full container spec, with its defaults
// and with every field given, is the golden file's (go test -update
// rewrites them).
func TestExpandGolden(t *testing.T) {
	cases := map[string]api.PresetRequest{
		"vllm_defaults":   {Name: api.PresetVLLM},
		"vllm_two_gpus":   {Name: api.PresetVLLM, Model: "meta-llama/Llama-3.1-8B-Instruct", GPUs: []string{"0", "1"}, TensorParallelSize: 2, MaxModelLen: 8192, Port: 8001, HFTokenSecret: "hf-token"},
		"ollama_defaults": {Name: api.PresetOllama},
		"ollama_cpu":      {Name: api.PresetOllama, Model: "llama3.2:1b", GPUs: []string{"none"}, Port: 11500, Image: "registry.example/ollama:mirror", VCPUs: 2, MemoryMiB: 4096},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			spec, fe := Expand(in, "preset")
			if fe != nil {
				t.Fatalf("Expand: %v", fe)
			}
			got, err := json.MarshalIndent(spec, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/wire/preset -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the expansion (go test -update rewrites it):\n%s", path, got)
			}
		})
	}
}

// TestExpandFieldErrors: bad preset input is named field by field.
func TestExpandFieldErrors(t *testing.T) {
	cases := []struct {
		name  string
		in    api.PresetRequest
		field string
	}{
		{"unknown preset", api.PresetRequest{Name: "tgi"}, "preset.name"},
		{"empty name", api.PresetRequest{}, "preset.name"},
		{"model with space", api.PresetRequest{Name: api.PresetVLLM, Model: "a model"}, "preset.model"},
		{"negative port", api.PresetRequest{Name: api.PresetVLLM, Port: -1}, "preset.port"},
		{"port too big", api.PresetRequest{Name: api.PresetOllama, Port: 70000}, "preset.port"},
		{"tensor parallel over gpus", api.PresetRequest{Name: api.PresetVLLM, GPUs: []string{"0"}, TensorParallelSize: 2}, "preset.tensor_parallel_size"},
		{"tensor parallel negative", api.PresetRequest{Name: api.PresetVLLM, TensorParallelSize: -2}, "preset.tensor_parallel_size"},
		{"vllm without gpus", api.PresetRequest{Name: api.PresetVLLM, GPUs: []string{"none"}}, "preset.gpus"},
		{"all with an index", api.PresetRequest{Name: api.PresetVLLM, GPUs: []string{"all", "0"}}, "preset.gpus[0]"},
		{"empty gpu", api.PresetRequest{Name: api.PresetOllama, GPUs: []string{""}}, "preset.gpus[0]"},
		{"max model len negative", api.PresetRequest{Name: api.PresetVLLM, MaxModelLen: -5}, "preset.max_model_len"},
		{"ollama tensor parallel", api.PresetRequest{Name: api.PresetOllama, TensorParallelSize: 2}, "preset.tensor_parallel_size"},
		{"ollama max model len", api.PresetRequest{Name: api.PresetOllama, MaxModelLen: 100}, "preset.max_model_len"},
		{"image with digest", api.PresetRequest{Name: api.PresetOllama, Image: "ollama/ollama@sha256:ab"}, "preset.image"},
		{"tiny memory", api.PresetRequest{Name: api.PresetOllama, MemoryMiB: 10}, "preset.memory_mib"},
		{"hf token path", api.PresetRequest{Name: api.PresetVLLM, HFTokenSecret: "../x"}, "preset.hf_token_secret"},
	}
	for _, c := range cases {
		_, fe := Expand(c.in, "preset")
		if !slices.ContainsFunc(fe, func(e api.FieldError) bool { return e.Field == c.field }) {
			t.Errorf("%s: want a field error on %s, got %v", c.name, c.field, fe)
		}
	}
}

// TestNeedsGPU: "all" needs at least the tensor parallel size, "none"
// none, indices their count.
func TestNeedsGPU(t *testing.T) {
	for _, c := range []struct {
		in   api.PresetRequest
		need bool
		n    int
	}{
		{api.PresetRequest{Name: api.PresetVLLM}, true, 1},
		{api.PresetRequest{Name: api.PresetVLLM, TensorParallelSize: 4}, true, 4},
		{api.PresetRequest{Name: api.PresetVLLM, GPUs: []string{"0", "2"}}, true, 2},
		{api.PresetRequest{Name: api.PresetOllama, GPUs: []string{"none"}}, false, 0},
		{api.PresetRequest{Name: api.PresetOllama}, true, 1},
	} {
		if need, n := NeedsGPU(c.in); need != c.need || n != c.n {
			t.Errorf("NeedsGPU(%+v) = %v, %d; want %v, %d", c.in, need, n, c.need, c.n)
		}
	}
	if got := ParseGPUs(" 0, 1 ,"); !slices.Equal(got, []string{"0", "1"}) {
		t.Errorf("ParseGPUs = %q", got)
	}
}
