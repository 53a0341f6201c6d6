package task

import (
	"encoding/json"
	"regexp"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pattern"
)

const (
	// TypeImagePull pulls an OCI image through the node's container
	// runtime ahead of any instance, reporting the pull as task phases
	// ("resolve", "layer <short id> download", "layer <short id> extract",
	// "verify"); a container instance with that image then starts from the
	// engine's cache.
	TypeImagePull = "image.pull"
	// DefaultImagePullTimeoutSeconds and MaxImagePullTimeoutSeconds bound
	// one pull (params.timeout_seconds); ImagePullTimeout bounds the task
	// on the agent.
	DefaultImagePullTimeoutSeconds = 600
	MaxImagePullTimeoutSeconds     = 1800
	ImagePullTimeout               = MaxImagePullTimeoutSeconds*time.Second + 10*time.Second
	// MaxImageRefLen bounds params.ref.
	MaxImageRefLen = 255
)

// ImagePullParams are the params of image.pull.
type ImagePullParams struct {
	// Ref is the image reference without a scheme or a digest, e.g.
	// "registry.example:5000/team/vllm:v0.6" (no tag: "latest", or the
	// digest when one is pinned).
	Ref string `json:"ref"`
	// Digest, when set (sha256:<64 hex>), pins the image: a registry
	// serving another one fails the task (image_pull_failed).
	Digest string `json:"digest,omitempty"`
	// RegistryAuth names a secret on the node holding the registry
	// credentials (the engine's auth JSON, as a container instance's
	// container.registry_auth).
	RegistryAuth string `json:"registry_auth,omitempty"`
	// TimeoutSeconds bounds the pull (default 600, at most 1800).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
}

// ImagePullLayer is one layer of an image.pull's output.
type ImagePullLayer struct {
	ID         string `json:"id"`     // the engine's short id
	Status     string `json:"status"` // its last status ("Pull complete", "Already exists")
	DownloadMS int64  `json:"download_ms,omitempty"`
	ExtractMS  int64  `json:"extract_ms,omitempty"`
}

// ImagePullOutput is image.pull's output.
type ImagePullOutput struct {
	Ref     string           `json:"ref"`
	Digest  string           `json:"digest,omitempty"` // the pinned digest, when one was
	ImageID string           `json:"image_id"`
	Engine  string           `json:"engine,omitempty"` // docker, podman
	Layers  []ImagePullLayer `json:"layers"`
}

var (
	imageRefRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:-]*$`)
	imageDigestRE = pattern.Must(`^sha256:[0-9a-f]{64}$`, `^sha256:[0-9a-f]*$`, 71, 71)
)

// ImagePullSpec is image.pull's registry entry.
func ImagePullSpec() Spec {
	return Spec{Type: TypeImagePull, Validate: validateImagePull, Timeout: ImagePullTimeout,
		Meaning: "pull an OCI image through the node's container runtime (phases: resolve, each layer's download and extract, verify); instances with it then start from the engine's cache",
		Params:  ImagePullParams{}}
}

// DecodeImagePullParams strictly decodes and validates image.pull's params
// and applies the default timeout.
func DecodeImagePullParams(params json.RawMessage) (ImagePullParams, []api.FieldError) {
	var p ImagePullParams
	if fe := DecodeParams(params, &p); fe != nil {
		return ImagePullParams{}, fe
	}
	var fe []api.FieldError
	if msg := checkImageRef(p.Ref); msg != "" {
		fe = append(fe, api.FieldError{Field: "params.ref", Message: msg})
	}
	if p.Digest != "" && !imageDigestRE.MatchString(p.Digest) {
		fe = append(fe, api.FieldError{Field: "params.digest", Message: "must be sha256:<64 lowercase hex digits>"})
	}
	if p.RegistryAuth != "" && !api.ValidSecretName(p.RegistryAuth) {
		fe = append(fe, api.FieldError{Field: "params.registry_auth", Message: "must be a secret name (" + api.SecretNamePattern + ")"})
	}
	if p.TimeoutSeconds < 0 || p.TimeoutSeconds > MaxImagePullTimeoutSeconds {
		fe = append(fe, api.FieldError{Field: "params.timeout_seconds", Message: "must be between 0 (default 600) and 1800"})
	}
	if fe != nil {
		return ImagePullParams{}, fe
	}
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = DefaultImagePullTimeoutSeconds
	}
	return p, nil
}

// checkImageRef accepts an image reference without a scheme or a digest.
func checkImageRef(ref string) string {
	switch {
	case ref == "":
		return "required: an image reference such as registry.example/repo:tag"
	case len(ref) > MaxImageRefLen:
		return "must be at most 255 characters"
	case strings.Contains(ref, "://"):
		return "must be an image reference without a scheme (registry.example/repo:tag, not https://…)"
	case strings.Contains(ref, "@"):
		return "must not carry a digest: pin it with params.digest"
	case !imageRefRE.MatchString(ref) || strings.Contains(ref, "//") || strings.HasSuffix(ref, "/") || strings.HasSuffix(ref, ":"):
		return "must be an image reference such as registry.example/repo:tag (letters, digits, . _ - / :; no whitespace)"
	}
	return ""
}

// ImageRefHasTag reports whether ref names a tag (a ":" after its last
// "/"; a registry's port does not count).
func ImageRefHasTag(ref string) bool {
	return strings.Contains(ref[strings.LastIndex(ref, "/")+1:], ":")
}

func validateImagePull(params json.RawMessage) []api.FieldError {
	_, fe := DecodeImagePullParams(params)
	return fe
}
