//go:build !linux

package oci

import (
	"context"
	"errors"
	"path/filepath"
)

// CopyForFirecracker is Linux-only: Firecracker runs only there.
func CopyForFirecracker(_ context.Context, _, dst string) (bool, error) {
	return false, overlayError(filepath.Base(filepath.Dir(dst)), errors.New("copying a root filesystem for Firecracker needs Linux"))
}
