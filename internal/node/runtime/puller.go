package runtime

import (
	"context"
	"errors"
)

// ErrDigestMismatch is wrapped by the error of a pull whose image is not
// the pinned digest (image_pull_failed).
var ErrDigestMismatch = errors.New("digest mismatch")

// ImagePuller is a runtime that can pull an OCI image ahead of any
// instance (the container runtime; the agent's image.pull task). Pull
// returns the pulled image's id; progress sees each change of a layer's
// status in order (layer "" for the image-wide lines); a non-empty digest
// must match the pulled image's, else the error says both.
type ImagePuller interface {
	Pull(ctx context.Context, ref, digest string, auth []byte, progress func(layer, status string)) (imageID string, err error)
}

// Containers is the Router's container runtime.
func (r *Router) Containers() Runtime { return r.ct }

// PullerOf is rt's image puller: rt itself, or a Router's container
// runtime; false when neither pulls images (a host without a container
// runtime).
func PullerOf(rt Runtime) (ImagePuller, bool) {
	if p, ok := rt.(ImagePuller); ok {
		return p, true
	}
	if r, ok := rt.(*Router); ok && r.ct != nil {
		p, ok := r.ct.(ImagePuller)
		return p, ok
	}
	return nil, false
}
