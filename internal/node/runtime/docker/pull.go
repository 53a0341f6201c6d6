package docker

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

var _ runtime.ImagePuller = (*Runtime)(nil)

// Pull fetches ref through the engine and returns the pulled image's id
// (runtime.ImagePuller, for the agent's image.pull task). auth, when not
// empty, is the engine's registry auth (a JSON AuthConfig, as the
// registry_auth secret holds it). progress, when not nil, sees each change
// of a layer's status in order ("Pulling fs layer", "Downloading",
// "Download complete", "Extracting", "Pull complete", "Already exists");
// the image-wide lines ("Pulling from …", "Digest: …", "Status: …") come
// with layer "". A non-empty digest (sha256:…) must be one of the pulled
// image's repo digests, else the error is image_pull_failed wrapping
// runtime.ErrDigestMismatch and naming both. Errors are *runtime.Error with
// reason image_pull_failed.
func (r *Runtime) Pull(ctx context.Context, ref, digest string, auth []byte, progress func(layer, status string)) (string, error) {
	return r.pullImage(ctx, "pull", ref, ref, digest, auth, progress)
}

// pullImage is Pull for op ("create", "pull") on id.
func (r *Runtime) pullImage(ctx context.Context, op, id, ref, digest string, auth []byte, progress func(layer, status string)) (string, error) {
	var opts client.ImagePullOptions
	if len(auth) > 0 {
		opts.RegistryAuth = base64.URLEncoding.EncodeToString(auth)
	}
	resp, err := r.cli.ImagePull(ctx, ref, opts)
	if err != nil {
		return "", r.fail(api.ReasonImagePullFailed, op, id, fmt.Errorf("pull %s: %w", ref, err))
	}
	defer resp.Close()
	last := map[string]string{} // layer → last status seen
	for m, err := range resp.JSONMessages(ctx) {
		if err != nil {
			return "", r.fail(api.ReasonImagePullFailed, op, id, fmt.Errorf("pull %s: %w", ref, err))
		}
		if m.Error != nil {
			return "", runtime.Errorf(api.ReasonImagePullFailed, op, id, "pull %s: %s", ref, m.Error.Message)
		}
		if m.Status == "" || last[m.ID] == m.Status {
			continue
		}
		last[m.ID] = m.Status
		if progress != nil {
			layer := m.ID
			if !isLayerID(layer) {
				layer = ""
			}
			progress(layer, m.Status)
		}
	}
	img, err := r.cli.ImageInspect(ctx, ref)
	if err != nil {
		return "", r.fail(api.ReasonImagePullFailed, op, id, fmt.Errorf("inspect pulled image %s: %w", ref, err))
	}
	if digest != "" && !hasDigest(img.RepoDigests, digest) {
		served := strings.Join(img.RepoDigests, ", ")
		if served == "" {
			served = "no repo digest"
		}
		return "", runtime.Errorf(api.ReasonImagePullFailed, op, id,
			"pull %s: %w: the registry served %s, the pinned digest is %s", ref, runtime.ErrDigestMismatch, served, digest)
	}
	return img.ID, nil
}

// isLayerID tells a layer's short id (12 or more hex digits, or a
// sha256: digest) from the image-wide ids of a pull's progress lines (the
// tag or the reference).
func isLayerID(s string) bool {
	s = strings.TrimPrefix(s, "sha256:")
	if len(s) < 12 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
