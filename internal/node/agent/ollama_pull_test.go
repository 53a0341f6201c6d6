package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// fakeOllama answers POST /api/pull with the JSON lines Ollama streams
// (pulling manifest, per-layer progress, verifying, writing, success), or
// the error line of a model the registry does not have.
func fakeOllama(t *testing.T) (*httptest.Server, *[]string) {
	var mu sync.Mutex
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/pull" {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Name   string `json:"name"`
			Stream bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		asked = append(asked, req.Name)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		fl := w.(http.Flusher)
		line := func(s string) { fmt.Fprintln(w, s); fl.Flush() }
		line(`{"status":"pulling manifest"}`)
		if req.Name == "nosuch" {
			line(`{"error":"pull model manifest: file does not exist"}`)
			return
		}
		const total = 3826793677
		for _, done := range []int64{0, total / 2, total} {
			line(fmt.Sprintf(`{"status":"pulling 8934d96d3f08","digest":"sha256:8934d96d3f08","total":%d,"completed":%d}`, total, done))
		}
		line(`{"status":"verifying sha256 digest"}`)
		line(`{"status":"writing manifest"}`)
		line(`{"status":"success"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &asked
}

// TestOllamaPull: Ready for an Ollama preset pulls its model through the
// forwarded port once per start, reporting each step as the status message
// (phase Ready) and then success; a model the server cannot pull ends
// with a clear failure message; other specs pull nothing.
func TestOllamaPull(t *testing.T) {
	srv, asked := fakeOllama(t)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())
	var mu sync.Mutex
	msgs := map[string][]string{}
	report := func(_ context.Context, id string, rep api.InstanceStatusReport) error {
		if rep.Phase != api.InstanceReady || rep.Generation != 3 {
			t.Errorf("progress report %+v: want phase Ready at generation 3", rep)
		}
		mu.Lock()
		msgs[id] = append(msgs[id], rep.Message)
		mu.Unlock()
		return nil
	}
	p := newOllamaPulls(t.Context(), report, slog.New(slog.DiscardHandler))
	p.every = 0
	started := time.Now()
	ready := api.InstanceStatusReport{Generation: 3, Phase: api.InstanceReady,
		Runtime: &api.InstanceRuntime{Ports: map[string]int{"api": port}, StartedAt: &started}}
	spec := func(model string) api.InstanceSpec {
		return api.InstanceSpec{Preset: &api.PresetRequest{Name: api.PresetOllama, Model: model, Port: 1}}
	}
	p.observe("i-ok", spec("llama2"), ready)
	p.observe("i-ok", spec("llama2"), ready) // the same start: no second pull
	p.observe("i-bad", spec("nosuch"), ready)
	p.observe("i-vllm", api.InstanceSpec{Preset: &api.PresetRequest{Name: api.PresetVLLM, Model: "m"}}, ready)
	p.observe("i-plain", api.InstanceSpec{}, ready)
	p.wait()

	if got := strings.Join(*asked, ","); got != "llama2,nosuch" && got != "nosuch,llama2" {
		t.Errorf("pulls asked: %q", got)
	}
	ok := strings.Join(msgs["i-ok"], "\n")
	for _, want := range []string{"ollama pull llama2: starting", "ollama pull llama2: pulling manifest",
		"ollama pull llama2: pulling 8934d96d3f08: 49% (1824/3649 MB)", "ollama pull llama2: pulling 8934d96d3f08: 100%",
		"ollama pull llama2: writing manifest", "ollama model llama2 pulled"} {
		if !strings.Contains(ok, want) {
			t.Errorf("progress lacks %q:\n%s", want, ok)
		}
	}
	bad := msgs["i-bad"]
	if len(bad) == 0 || !strings.Contains(bad[len(bad)-1], "ollama pull nosuch failed: pull model manifest: file does not exist") {
		t.Errorf("failure message: %q", bad)
	}
	if len(msgs["i-vllm"])+len(msgs["i-plain"]) != 0 {
		t.Errorf("pulled for a non-Ollama spec: %v", msgs)
	}

	// The server gone: the failure says it is not reachable.
	srv.Close()
	restarted := started.Add(time.Second)
	again := ready
	again.Runtime = &api.InstanceRuntime{Ports: map[string]int{"api": port}, StartedAt: &restarted}
	p.observe("i-ok", spec("llama2"), again)
	p.wait()
	if last := msgs["i-ok"][len(msgs["i-ok"])-1]; !strings.Contains(last, "ollama server not reachable") {
		t.Errorf("unreachable: %q", last)
	}
}
