package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/wire/api"
)

// recheckTimeout bounds reading an overlay's header.
const recheckTimeout = 30 * time.Second

// overlayInfo is the part of `qemu-img info --output=json` of an overlay
// that recheckBase reads.
type overlayInfo struct {
	Format              string `json:"format"`
	BackingFilename     string `json:"backing-filename"`
	FullBackingFilename string `json:"full-backing-filename"`
	BackingFormat       string `json:"backing-filename-format"`
	FormatSpecific      struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// recheckBase checks, before QEMU opens overlay, the base image it sits
// on, as QEMU will open it: the backing file the overlay's header names,
// in the backing format it names (image.Inspect through r.inspect, so a
// base blob already accepted costs nothing). An instance created before
// Create inspected its base, or whose cached blob was replaced since, must
// not boot a base that names a host file (a qcow2 external data file, a
// backing file) or has another format. The overlay itself is read with
// qemu-img info, which opens neither its backing file nor a data file;
// one that is not qcow2 or names a data file is refused too.
//
// It returns the reason to fail Start with: image_pull_failed (the error
// names spec.image) for the base, rootfs_build_failed for the overlay.
func (r *Runtime) recheckBase(ctx context.Context, overlay string) (api.ReasonCode, error) {
	ctx, cancel := context.WithTimeout(ctx, recheckTimeout)
	defer cancel()
	out, err := runTool(ctx, r.opts.QEMUImg, "info", "--output=json", "-U", "-f", "qcow2", overlay)
	if err != nil {
		return api.ReasonRootfsBuildFailed, fmt.Errorf("overlay %s: %w", overlay, err)
	}
	var oi overlayInfo
	if err := json.Unmarshal(out, &oi); err != nil {
		return api.ReasonRootfsBuildFailed, fmt.Errorf("overlay %s: qemu-img info: %w", overlay, err)
	}
	if oi.Format != image.FormatQCOW2 || oi.FormatSpecific.Data.DataFile != "" {
		return api.ReasonRootfsBuildFailed, fmt.Errorf("overlay %s: format %q, data file %q: want a plain qcow2 overlay",
			overlay, oi.Format, oi.FormatSpecific.Data.DataFile)
	}
	base := oi.FullBackingFilename
	if base == "" {
		base = oi.BackingFilename
	}
	if base == "" {
		if oi.BackingFormat != "" {
			return api.ReasonImagePullFailed, fmt.Errorf("spec.image: overlay %s names a %s base but no file", overlay, oi.BackingFormat)
		}
		return "", nil // no base: QEMU opens the overlay alone
	}
	if !filepath.IsAbs(base) {
		return api.ReasonImagePullFailed, fmt.Errorf("spec.image: overlay %s names base %q, not an absolute path", overlay, base)
	}
	if _, err := r.inspect(ctx, base, oi.BackingFormat); err != nil {
		return api.ReasonImagePullFailed, fmt.Errorf("spec.image: %w", err)
	}
	return "", nil
}
