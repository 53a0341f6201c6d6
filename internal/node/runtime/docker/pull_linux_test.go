package docker

import (
	"errors"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestPullProgress: Pull reports each layer's status changes in order
// (image-wide lines with layer ""), returns the image id, and a second
// pull of the cached image reports no download; a pinned digest the
// registry does not serve is image_pull_failed wrapping ErrDigestMismatch
// with both digests named.
func TestPullProgress(t *testing.T) {
	r := env(t)
	rt := r.newRuntime(t, t.TempDir())
	ctx := testCtx(t)
	type line struct{ layer, status string }
	var lines []line
	id, err := rt.Pull(ctx, r.other.Ref, r.other.Digest, nil, func(layer, status string) { lines = append(lines, line{layer, status}) })
	if err != nil || !strings.HasPrefix(id, "sha256:") {
		t.Fatalf("pull: %q %v", id, err)
	}
	layers := map[string][]string{}
	for _, l := range lines {
		if l.layer != "" {
			layers[l.layer] = append(layers[l.layer], l.status)
		}
	}
	if len(layers) == 0 {
		t.Fatalf("no layer progress: %+v", lines)
	}
	for l, st := range layers {
		if last := st[len(st)-1]; last != "Pull complete" && last != "Already exists" {
			t.Errorf("layer %s ends %q: %q", l, last, st)
		}
	}
	lines = nil
	if _, err := rt.Pull(ctx, r.other.Ref, "", nil, func(layer, status string) { lines = append(lines, line{layer, status}) }); err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if l.layer != "" && l.status != "Already exists" {
			t.Errorf("cached image downloaded again: %+v", lines)
			break
		}
	}

	wrong := "sha256:" + strings.Repeat("0", 64)
	_, err = rt.Pull(ctx, r.other.Ref, wrong, nil, nil)
	if runtime.ReasonOf(err, "") != api.ReasonImagePullFailed || !errors.Is(err, runtime.ErrDigestMismatch) ||
		!strings.Contains(err.Error(), r.other.Digest) || !strings.Contains(err.Error(), wrong) {
		t.Fatalf("digest mismatch: %v", err)
	}
}
