//go:build windows

package statedir

import (
	"io/fs"
)

// checkDirPerm: Windows protects the directory with ACLs, which the
// installer sets; unix mode bits mean nothing there.
func checkDirPerm(string, fs.FileInfo) error { return nil }
