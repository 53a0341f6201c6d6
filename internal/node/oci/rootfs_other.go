//go:build !linux

package oci

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
)

// errLinuxOnly: root filesystems are built with Linux's chown, mknod and
// e2fsprogs.
var errLinuxOnly = errors.New("building root filesystems from OCI images needs a Linux agent")

func extractLayers(context.Context, string, []Layer, []string, string, ProgressFunc, *slog.Logger) (treeStats, error) {
	return treeStats{}, &BuildError{Err: errLinuxOnly}
}

func diskUsage(fi fs.FileInfo) int64 { return fi.Size() }
