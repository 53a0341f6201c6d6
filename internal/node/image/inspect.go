package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Disk image formats a VM may use. Every other format is refused: vmdk,
// vhdx, qed and friends can name other files (extents, backing files) that
// QEMU would open on the host.
const (
	FormatQCOW2 = "qcow2"
	FormatRaw   = "raw"
)

// inspectTimeout bounds one qemu-img info run.
const inspectTimeout = 30 * time.Second

// ErrUnsafeImage: a disk image names a host file QEMU would open (a backing
// file, an external data file) or has a format other than qcow2 or raw.
// *UnsafeImageError is it for errors.Is.
var ErrUnsafeImage = errors.New("unsafe disk image")

// UnsafeImageError says which header field of a disk image was refused.
type UnsafeImageError struct {
	Path   string // the image inspected
	Format string // its format
	Field  string // qemu-img info's field: "format", "backing-filename", "data-file"
	Value  string // the field's value
}

func (e *UnsafeImageError) Error() string {
	switch e.Field {
	case "format":
		return fmt.Sprintf("disk format %q refused (want qcow2 or raw)", e.Value)
	case "data-file":
		return fmt.Sprintf("%s external data-file %q refused", e.Format, e.Value)
	}
	return fmt.Sprintf("%s backing file %q refused", e.Format, e.Value)
}

func (e *UnsafeImageError) Is(target error) bool { return target == ErrUnsafeImage }

// Info is what Inspect learned about a disk image it accepted.
type Info struct {
	Format      string // FormatQCOW2 or FormatRaw
	VirtualSize int64  // bytes the guest sees
}

// qemuImgInfo is the part of `qemu-img info --output=json` Inspect reads.
type qemuImgInfo struct {
	Format              string `json:"format"`
	VirtualSize         int64  `json:"virtual-size"`
	BackingFilename     string `json:"backing-filename"`
	FullBackingFilename string `json:"full-backing-filename"`
	BackingFormat       string `json:"backing-filename-format"`
	FormatSpecific      struct {
		Type string `json:"type"`
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// Inspect checks a disk image before anything uses it: `qemu-img info
// --output=json` (with -f format unless format is "", which lets qemu-img
// probe it) must show a qcow2 or raw image that names no other file: no
// backing file (backing-filename, full-backing-filename), so no backing
// chain, and no qcow2 external data file (format-specific.data.data-file).
// Such an image would make QEMU open the named host file and hand its bytes
// to the guest. A refusal is an *UnsafeImageError (ErrUnsafeImage); path
// must be absolute.
//
// It does not pass --backing-chain: that makes qemu-img open the backing
// file a crafted header names (any host path, a FIFO that blocks forever),
// and the image's own header already says whether there is a chain.
// qemu-img info opens neither backing nor data files.
//
// The format a caller then hands QEMU and qemu-img must be Info.Format,
// given explicitly (format=, -F), never probed again.
func Inspect(ctx context.Context, qemuImg, path, format string) (Info, error) {
	if !filepath.IsAbs(path) {
		return Info{}, fmt.Errorf("inspect %s: path is not absolute", path)
	}
	if format != "" && format != FormatQCOW2 && format != FormatRaw {
		return Info{}, &UnsafeImageError{Path: path, Format: format, Field: "format", Value: format}
	}
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	args := []string{"info", "--output=json"}
	if format != "" {
		args = append(args, "-f", format)
	}
	args = append(args, path)
	cmd := exec.CommandContext(ctx, qemuImg, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Info{}, fmt.Errorf("qemu-img info %s: %w: %s", path, err, strings.TrimSpace(stderr.String()))
	}
	return checkInfo(path, out)
}

// checkInfo applies Inspect's rules to qemu-img info's JSON.
func checkInfo(path string, out []byte) (Info, error) {
	var qi qemuImgInfo
	if err := json.Unmarshal(out, &qi); err != nil {
		return Info{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	refuse := func(field, value string) error {
		return &UnsafeImageError{Path: path, Format: qi.Format, Field: field, Value: value}
	}
	switch {
	case qi.Format == "":
		return Info{}, fmt.Errorf("qemu-img info %s: no format", path)
	case qi.Format != FormatQCOW2 && qi.Format != FormatRaw:
		return Info{}, refuse("format", qi.Format)
	case qi.FormatSpecific.Data.DataFile != "":
		return Info{}, refuse("data-file", qi.FormatSpecific.Data.DataFile)
	case qi.BackingFilename != "":
		return Info{}, refuse("backing-filename", qi.BackingFilename)
	case qi.FullBackingFilename != "":
		return Info{}, refuse("backing-filename", qi.FullBackingFilename)
	case qi.BackingFormat != "":
		return Info{}, refuse("backing-filename", "(format "+qi.BackingFormat+")")
	}
	return Info{Format: qi.Format, VirtualSize: qi.VirtualSize}, nil
}
