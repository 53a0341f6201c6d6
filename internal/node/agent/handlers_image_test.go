package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// phaseRec records the phases a handler reports.
type phaseRec struct {
	name string
	d    time.Duration
	err  error
}

func runPull(t *testing.T, h agent.Handler, params string) ([]phaseRec, agent.Outcome, error) {
	t.Helper()
	var phases []phaseRec
	out, err := h.Run(context.Background(), agent.Task{ID: "t1", Type: task.TypeImagePull, Params: json.RawMessage(params),
		Progress: func(phase string, d time.Duration, err error) { phases = append(phases, phaseRec{phase, d, err}) }})
	return phases, out, err
}

// phaseNames lists phases as "name=duration".
func phaseNames(phases []phaseRec) []string {
	var names []string
	for _, p := range phases {
		names = append(names, fmt.Sprintf("%s=%s", p.name, p.d))
	}
	return names
}

func handlerCode(err error) string {
	var he *agent.HandlerError
	if errors.As(err, &he) {
		return he.Code
	}
	return ""
}

// TestImagePullHandlerNoRuntime: a node without a container runtime (none
// at all, or a VM runtime only) answers image.pull with
// container_runtime_unavailable; bad params are invalid_params; a
// registry_auth secret the node lacks is secrets_missing.
func TestImagePullHandlerNoRuntime(t *testing.T) {
	noSecret := func(name string) ([]byte, error) { return nil, fmt.Errorf("secret %q: %w", name, fs.ErrNotExist) }
	for _, rt := range []runtime.Runtime{nil, mock.New(mock.Options{})} {
		h := agent.ImagePullHandler(func() runtime.Runtime { return rt }, noSecret, time.Now)
		if _, _, err := runPull(t, h, `{"ref":"busybox"}`); handlerCode(err) != agent.CodeContainerRuntimeUnavailable {
			t.Errorf("runtime %v: %v, want %s", rt, err, agent.CodeContainerRuntimeUnavailable)
		}
	}
	h := agent.ImagePullHandler(func() runtime.Runtime { return nil }, noSecret, time.Now)
	if _, _, err := runPull(t, h, `{"ref":"https://x/y"}`); handlerCode(err) != "invalid_params" {
		t.Errorf("bad ref: %v", err)
	}
	dk := fakePuller{}
	h = agent.ImagePullHandler(func() runtime.Runtime { return dk }, noSecret, time.Now)
	if _, _, err := runPull(t, h, `{"ref":"busybox","registry_auth":"reg"}`); handlerCode(err) != string(api.ReasonSecretsMissing) {
		t.Errorf("missing secret: %v", err)
	}
}

// fakePuller is a runtime that pulls with a fixed script (no engine).
type fakePuller struct{ runtime.Runtime }

func (fakePuller) Pull(_ context.Context, ref, digest string, auth []byte, progress func(layer, status string)) (string, error) {
	return "sha256:feed", nil
}

// TestImagePullPhasesCoalesced: the engine's many lines per layer become
// one download and one extract phase per layer (from its first line to
// "Download complete", from its first "Extracting" to "Pull complete"),
// after resolve and before verify; a layer the engine has is "cached".
func TestImagePullPhasesCoalesced(t *testing.T) {
	clock := time.Unix(0, 0)
	now := func() time.Time { clock = clock.Add(10 * time.Millisecond); return clock }
	script := [][2]string{{"", "Pulling from drover/app"},
		{"aaaaaaaaaaaa", "Pulling fs layer"}, {"bbbbbbbbbbbb", "Already exists"},
		{"aaaaaaaaaaaa", "Waiting"}, {"aaaaaaaaaaaa", "Downloading"}, {"aaaaaaaaaaaa", "Verifying Checksum"},
		{"aaaaaaaaaaaa", "Download complete"}, {"aaaaaaaaaaaa", "Extracting"}, {"aaaaaaaaaaaa", "Pull complete"},
		{"", "Digest: sha256:x"}, {"", "Status: Downloaded newer image for drover/app:v1"}}
	rt := scriptPuller{script: script}
	h := agent.ImagePullHandler(func() runtime.Runtime { return rt }, nil, now)
	phases, out, err := runPull(t, h, `{"ref":"drover/app:v1"}`)
	if err != nil {
		t.Fatal(err)
	}
	names := phaseNames(phases)
	want := []string{"resolve=20ms", "layer bbbbbbbbbbbb cached=0s", "layer aaaaaaaaaaaa download=50ms",
		"layer aaaaaaaaaaaa extract=10ms", "verify=10ms"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("phases %q, want %q", names, want)
	}
	o := out.Output.(task.ImagePullOutput)
	if o.ImageID != "sha256:feed" || len(o.Layers) != 2 || o.Layers[0].DownloadMS != 50 || o.Layers[0].ExtractMS != 10 ||
		o.Layers[1].Status != "Already exists" {
		t.Errorf("output %+v", o)
	}
	if out.Timings["resolve_ms"] != 20 || out.Timings["verify_ms"] != 10 || out.Timings["layers_ms"] != 90 {
		t.Errorf("timings %v", out.Timings)
	}
}

// TestImagePullDownloadCompleteSkipped: the engine gives a slow reader
// only a layer's latest progress, so "Download complete" may not come;
// the download then ends at the layer's first "Extracting".
func TestImagePullDownloadCompleteSkipped(t *testing.T) {
	clock := time.Unix(0, 0)
	now := func() time.Time { clock = clock.Add(10 * time.Millisecond); return clock }
	script := [][2]string{{"", "Pulling from drover/app"},
		{"aaaaaaaaaaaa", "Pulling fs layer"}, {"aaaaaaaaaaaa", "Downloading"},
		{"aaaaaaaaaaaa", "Extracting"}, {"aaaaaaaaaaaa", "Extracting"}, {"aaaaaaaaaaaa", "Pull complete"}}
	h := agent.ImagePullHandler(func() runtime.Runtime { return scriptPuller{script: script} }, nil, now)
	phases, out, err := runPull(t, h, `{"ref":"drover/app:v1"}`)
	if err != nil {
		t.Fatal(err)
	}
	names := phaseNames(phases)
	want := []string{"resolve=20ms", "layer aaaaaaaaaaaa download=20ms", "layer aaaaaaaaaaaa extract=20ms", "verify=10ms"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("phases %q, want %q", names, want)
	}
	if o := out.Output.(task.ImagePullOutput); len(o.Layers) != 1 || o.Layers[0].DownloadMS != 20 || o.Layers[0].ExtractMS != 20 {
		t.Errorf("output %+v", o)
	}
}

type scriptPuller struct {
	runtime.Runtime
	script [][2]string
}

func (s scriptPuller) Pull(_ context.Context, ref, digest string, auth []byte, progress func(layer, status string)) (string, error) {
	for _, l := range s.script {
		progress(l[0], l[1])
	}
	return "sha256:feed", nil
}
