package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Create pulls the image (pinned by digest when the spec has one), writes
// the secrets into the instance's tmpfs and creates the container without
// starting it. An existing container with the same spec is a no-op; with
// another one it is ErrExists.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	if err := r.validate(spec); err != nil {
		return runtime.Status{}, err
	}
	id := spec.ID
	defer r.lock(id)()
	specBytes, err := specJSON(spec)
	if err != nil {
		return runtime.Status{}, runtime.Errorf(api.ReasonContainerStartFailed, "create", id, "encode spec: %w", err)
	}
	if ins, err := r.inspect(ctx, "create", id); err == nil {
		if ins.Config != nil && ins.Config.Labels[LabelSpecHash] == specHash(specBytes) {
			return r.status(ins), nil
		}
		return runtime.Status{}, &runtime.Error{Reason: api.ReasonContainerStartFailed, Op: "create", ID: id, Err: runtime.ErrExists}
	} else if !errors.Is(err, runtime.ErrNotFound) {
		return runtime.Status{}, err
	}
	image, err := r.pull(ctx, spec)
	if err != nil {
		return runtime.Status{}, err
	}
	secretsDir := ""
	files := maps.Clone(spec.Secrets)
	delete(files, spec.ContainerOrZero().RegistryAuth) // for the engine's pull only
	if len(files) > 0 {
		if secretsDir, err = writeSecrets(r.secretsDir(id), files); err != nil {
			return runtime.Status{}, runtime.Errorf(api.ReasonSecretsInjectionFailed, "create", id, "%w", err)
		}
	}
	es, err := r.toEngine(spec, image, secretsDir, specBytes)
	if err != nil {
		return runtime.Status{}, err
	}
	_, err = r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: containerName(id), Config: es.config, HostConfig: es.host})
	if err != nil {
		if secretsDir != "" {
			_ = wipeSecrets(secretsDir)
		}
		return runtime.Status{}, r.fail(createReason(err), "create", id, fmt.Errorf("create container: %w", gpuHint(err)))
	}
	ins, err := r.inspect(ctx, "create", id)
	if err != nil {
		return runtime.Status{}, err
	}
	return r.status(ins), nil
}

// createReason says which step a refused create failed: a GPU the engine
// cannot give (no NVIDIA runtime, no CDI spec) or a mount, else the start.
func createReason(err error) api.ReasonCode {
	msg := strings.ToLower(err.Error())
	switch {
	case strings.Contains(msg, "mount") || strings.Contains(msg, "volume"):
		return api.ReasonVolumeAttachFailed
	default:
		return api.ReasonContainerStartFailed
	}
}

// gpuHint explains a GPU request the engine could not satisfy (seed 003's
// "GPU not accessible").
func gpuHint(err error) error {
	msg := err.Error()
	if strings.Contains(msg, "could not select device driver") || strings.Contains(msg, "nvidia") ||
		strings.Contains(msg, "CDI") || strings.Contains(msg, "cdi") {
		return fmt.Errorf("GPU not accessible: the engine has no NVIDIA runtime or CDI spec for the requested GPUs "+
			"(install nvidia-container-toolkit; for Podman generate the CDI spec with nvidia-ctk cdi generate): %w", err)
	}
	return err
}

// pull fetches spec.Image (Pull) and returns the image id to run. Progress
// goes out as EventProgress; an image whose digest is not the spec's is
// refused (image_pull_failed, "digest mismatch").
func (r *Runtime) pull(ctx context.Context, spec runtime.Spec) (string, error) {
	id, ref := spec.ID, spec.Image.Ref
	start := time.Now()
	var auth []byte
	if name := spec.ContainerOrZero().RegistryAuth; name != "" {
		cred, ok := spec.Secrets[name]
		if !ok {
			return "", runtime.Errorf(api.ReasonSecretsMissing, "create", id, "registry auth secret %q not given", name)
		}
		auth = cred
	}
	imageID, err := r.pullImage(ctx, "create", id, ref, spec.Image.Digest, auth, func(layer, status string) {
		line := "pull " + ref + ": " + status
		if layer != "" {
			line = "pull " + ref + ": " + layer + ": " + status
		}
		r.log.Debug("image pull", "instance", id, "progress", line)
		r.emit(runtime.Event{ID: id, Kind: runtime.EventProgress, At: time.Now(), Detail: line})
	})
	if err != nil {
		return "", err
	}
	r.emit(runtime.Event{ID: id, Kind: runtime.EventProgress, At: time.Now(),
		Detail: fmt.Sprintf("pull %s: done in %s (%s)", ref, time.Since(start).Round(time.Millisecond), imageID)})
	return imageID, nil
}

// hasDigest reports whether one of an image's repo digests (repo@sha256:…)
// is digest.
func hasDigest(repoDigests []string, digest string) bool {
	for _, d := range repoDigests {
		if _, dg, ok := strings.Cut(d, "@"); ok && dg == digest {
			return true
		}
	}
	return false
}

// writeSecrets puts each secret in a file of mode 0400 in dir, a tmpfs
// mounted for the instance, and returns dir.
func writeSecrets(dir string, secrets map[string][]byte) (string, error) {
	if err := mountSecrets(dir); err != nil {
		return "", fmt.Errorf("secrets tmpfs %s: %w", dir, err)
	}
	for name, b := range secrets {
		p := filepath.Join(dir, name)
		_ = os.Remove(p) // a leftover of an earlier create
		if err := os.WriteFile(p, b, 0o400); err != nil {
			_ = wipeSecrets(dir)
			return "", fmt.Errorf("secret %s: %w", name, err)
		}
	}
	return dir, nil
}

// wipeSecrets unmounts and removes an instance's secrets directory.
func wipeSecrets(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unmountSecrets(dir); err != nil {
		return fmt.Errorf("unmount secrets %s: %w", dir, err)
	}
	return os.RemoveAll(dir)
}
