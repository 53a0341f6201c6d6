//go:build !windows

package diag

import (
	"errors"
	"syscall"
)

func defaultRootPath() string { return "/" }

func isNoSpace(err error) bool  { return errors.Is(err, syscall.ENOSPC) }
func isQuota(err error) bool    { return errors.Is(err, syscall.EDQUOT) }
func isReadOnly(err error) bool { return errors.Is(err, syscall.EROFS) }
