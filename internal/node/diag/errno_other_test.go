//go:build !windows

package diag

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

func TestDescribeWriteError(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{&fs.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC}, "no space left on device"},
		{fmt.Errorf("x: %w", syscall.EDQUOT), "disk quota exceeded"},
		{fmt.Errorf("x: %w", syscall.EROFS), "read-only file system"},
		{fmt.Errorf("x: %w", fs.ErrPermission), "permission denied"},
		{errors.New("odd failure"), "odd failure"},
	}
	for _, tc := range tests {
		if got := describeWriteError(tc.err); got != tc.want {
			t.Errorf("describeWriteError(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
