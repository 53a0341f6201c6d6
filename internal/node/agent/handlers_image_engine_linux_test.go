// The engine test needs Linux: dockertest starts a private dockerd.

package agent_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker"
	"github.com/drover-dev/drover/internal/node/runtime/docker/dockertest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// TestImagePullHandlerEngine: against a real engine and an in-test
// registry, image.pull of a two-layer image reports resolve, each layer's
// download then extract, and verify, in that order, each with a duration;
// the output names the image id and the layers. Pulled again it downloads
// nothing. A pinned digest the registry does not serve fails the task with
// image_pull_failed naming both digests, and verify failed.
func TestImagePullHandlerEngine(t *testing.T) {
	dockertest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := dockertest.StartRegistry()
	defer reg.Close()
	bb, err := ocitest.BusyboxLayer("")
	if err != nil {
		t.Fatal(err)
	}
	extra, err := ocitest.Layer(ocitest.File{Hdr: tar.Header{Name: "etc/drover-pull", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg}, Body: []byte("hi\n")})
	if err != nil {
		t.Fatal(err)
	}
	im, err := ocitest.NewImage(v1.Config{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/bin"}}, bb, extra)
	if err != nil {
		t.Fatal(err)
	}
	img, err := reg.PushImage("drover/pull", "v1", im)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := dockertest.StartEngine(ctx, reg.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	rt, err := docker.New(ctx, docker.Options{Host: eng.Host, Root: t.TempDir(), Network: "host"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	h := agent.ImagePullHandler(func() runtime.Runtime { return rt }, nil, time.Now)

	phases, out, err := runPull(t, h, fmt.Sprintf(`{"ref":%q,"digest":%q}`, img.Ref, img.Digest))
	if err != nil {
		t.Fatalf("pull: %v (phases %+v)", err, phases)
	}
	t.Logf("phases: %+v", phases)
	if len(phases) < 2+2*2 || phases[0].name != "resolve" || phases[len(phases)-1].name != "verify" {
		t.Fatalf("phases %+v", phases)
	}
	seen := map[string]bool{}
	for _, p := range phases {
		if p.err != nil || p.d <= 0 {
			t.Errorf("phase %s: %s %v", p.name, p.d, p.err)
		}
		if id, ok := strings.CutSuffix(strings.TrimPrefix(p.name, "layer "), " extract"); ok && !seen["layer "+id+" download"] {
			t.Errorf("%s before its download: %+v", p.name, phases)
		}
		seen[p.name] = true
	}
	o := out.Output.(task.ImagePullOutput)
	if !strings.HasPrefix(o.ImageID, "sha256:") || len(o.Layers) != 2 || o.Engine == "" {
		t.Errorf("output %+v", o)
	}
	for _, l := range o.Layers {
		if !seen["layer "+l.ID+" download"] || !seen["layer "+l.ID+" extract"] || l.Status != "Pull complete" {
			t.Errorf("layer %+v: phases %+v", l, phases)
		}
	}
	if _, ok := out.Timings["resolve_ms"]; !ok {
		t.Errorf("timings %v", out.Timings)
	}

	phases, _, err = runPull(t, h, fmt.Sprintf(`{"ref":%q}`, img.Ref))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range phases {
		if strings.HasSuffix(p.name, " download") {
			t.Errorf("cached image downloaded again: %+v", phases)
		}
	}

	wrong := "sha256:" + strings.Repeat("0", 64)
	phases, _, err = runPull(t, h, fmt.Sprintf(`{"ref":%q,"digest":%q}`, img.Ref, wrong))
	var he *agent.HandlerError
	if !errors.As(err, &he) || he.Code != string(api.ReasonImagePullFailed) || !strings.Contains(he.Message, img.Digest) ||
		!strings.Contains(he.Message, wrong) {
		t.Fatalf("digest mismatch: %v", err)
	}
	if last := phases[len(phases)-1]; last.name != "verify" || last.err == nil {
		t.Errorf("phases %+v: want verify failed last", phases)
	}

	_, _, err = runPull(t, h, fmt.Sprintf(`{"ref":"%s/drover/absent:v1"}`, reg.Host))
	if handlerCode(err) != string(api.ReasonImagePullFailed) {
		t.Errorf("absent image: %v", err)
	}
}
