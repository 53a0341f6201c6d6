package slicevm

// Images and disks: fetching and verifying the base image, writing it onto
// the boot NVMe with qemu-img, and zeroing devices on release.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"strings"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// imageErr maps an image cache error to an *Error.
func imageErr(what string, err error) *Error {
	code := CodeImageFetchFailed
	switch {
	case errors.Is(err, image.ErrDigestMismatch):
		code = CodeImageDigest
	case errors.Is(err, image.ErrPathNotAllowed):
		code = CodeImagePathNotAllow
	}
	return &Error{CodedError: api.CodedError{Code: code, Message: what + ": " + err.Error(), Err: err}}
}

// imageSource is where the base image comes from, as the image cache and
// an api.Artifact spell it.
func imageSource(params task.VMProvisionParams) string {
	if params.ImagePath != "" {
		return (&url.URL{Scheme: "file", Path: params.ImagePath}).String()
	}
	return params.ImageURL
}

// fetchImage brings the base image (and a direct-boot kernel and initrd)
// into the content-addressed cache, checking each digest as it streams in.
// A local image_path must resolve under the cache's allowed directories.
func (p *Provisioner) fetchImage(ctx context.Context, params task.VMProvisionParams) (image.Result, step, error) {
	src := params.ImageURL
	if params.ImagePath != "" {
		resolved, err := p.opts.Images.CheckLocalPath(params.ImagePath)
		if err != nil {
			return image.Result{}, step{}, imageErr("image_path", err)
		}
		src = resolved
	}
	res, err := p.opts.Images.Fetch(ctx, src, params.ImageSHA256)
	if err != nil {
		return image.Result{}, step{}, imageErr("image", err)
	}
	how := "downloaded"
	if res.Cached {
		how = "cached"
	}
	detail := fmt.Sprintf("image %s: %s (%d bytes)", how, res.Path, res.Bytes)
	if b := params.Boot; b != nil {
		arts := map[string]api.Artifact{"kernel": b.Kernel}
		if b.Initrd != nil {
			arts["initrd"] = *b.Initrd
		}
		for _, name := range []string{"kernel", "initrd"} {
			a, ok := arts[name]
			if !ok {
				continue
			}
			r, err := p.opts.Images.Fetch(ctx, a.URL, a.SHA256)
			if err != nil {
				return image.Result{}, step{}, imageErr("boot."+name, err)
			}
			detail += fmt.Sprintf("; %s %s (%d bytes)", name, r.Path, r.Bytes)
		}
	}
	return res, done("%s", detail), nil
}

// verifyImage re-hashes the cached image unless the caller trusts it.
func (p *Provisioner) verifyImage(ctx context.Context, params task.VMProvisionParams) (step, error) {
	if params.ImageTrusted {
		return skipped("image_trusted"), nil
	}
	res, err := p.opts.Images.Verify(ctx, params.ImageSHA256)
	if err != nil {
		return step{}, imageErr("verify cached image", err)
	}
	return done("sha256 %s verified (%d bytes)", res.SHA256, res.Bytes), nil
}

// imageField is the param that names the base image.
func imageField(params task.VMProvisionParams) string {
	if params.ImagePath != "" {
		return "params.image_path"
	}
	return "params.image_url"
}

// writeImage writes img onto dev as raw bytes with qemu-img convert. img
// is checked first by image.Inspect (qcow2 or raw, naming no backing or
// external data file: such an image would make qemu-img copy a host file
// onto dev); a refusal is CodeImageUnsafe naming field, the param that
// gave the image. The inspected format is passed explicitly (never probed
// during the write), dev must be at least the image's virtual size, and -n
// keeps qemu-img from creating or truncating the target.
func (p *Provisioner) writeImage(ctx context.Context, qemuImg, field, img, dev string) (step, error) {
	info, err := image.Inspect(ctx, qemuImg, img, "")
	if errors.Is(err, image.ErrUnsafeImage) {
		msg := err.Error()
		return step{}, &Error{CodedError: api.CodedError{Code: CodeImageUnsafe, Message: field + ": " + msg,
			Fields: []api.FieldError{{Field: field, Message: msg}}, Err: err}}
	}
	if err != nil {
		return step{}, failf(CodeImageWriteFailed, "inspect %s: %w", img, err)
	}
	size, err := deviceSize(dev)
	if err != nil {
		return step{}, failf(CodeImageWriteFailed, "size of %s: %w", dev, err)
	}
	if size < info.VirtualSize {
		return step{}, blockf(CodeImageWriteFailed, "nvme_too_small:"+dev, "%s holds %d bytes, the image needs %d",
			dev, size, info.VirtualSize)
	}
	if _, err := runCmd(ctx, qemuImg, "convert", "-n", "-f", info.Format, "-O", "raw", img, dev); err != nil {
		return step{}, failf(CodeImageWriteFailed, "qemu-img convert %s onto %s: %w", img, dev, err)
	}
	return done("qemu-img convert -n -f %s -O raw %s %s (%d bytes)", info.Format, img, dev, info.VirtualSize), nil
}

// runCmd runs a command and returns its stdout; a failure carries stderr.
func runCmd(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return nil, fmt.Errorf("%w: %s", err, truncate(msg, 500))
		}
		return nil, err
	}
	return stdout.Bytes(), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// deviceSize is a block device's or file's size in bytes.
func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	return f.Seek(0, io.SeekEnd)
}

// wipeChunk is how much zeroDevice writes (or asks the kernel to zero)
// between context checks.
const wipeChunk = 4 << 20

// zeroDevice writes zeros over all of path (a block device or a file) and
// syncs it. On Linux a block device is zeroed by the kernel
// (BLKZEROOUT, which NVMe drives may offload as Write Zeroes). It returns
// the bytes zeroed.
func zeroDevice(ctx context.Context, path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, err
	}
	if fi.Mode()&fs.ModeDevice != 0 {
		done, err := kernelZero(ctx, f, size)
		if err == nil {
			return done, f.Sync()
		}
		if !errors.Is(err, errNoKernelZero) {
			return done, err
		}
	}
	buf := make([]byte, wipeChunk)
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return off, err
		}
		n := min(int64(len(buf)), size-off)
		w, err := f.WriteAt(buf[:n], off)
		off += int64(w)
		if err != nil {
			return off, err
		}
	}
	return size, f.Sync()
}

// errNoKernelZero says the kernel cannot zero this device; write zeros.
var errNoKernelZero = errors.New("kernel zeroing unavailable")
