//go:build !linux

package slicevm

import (
	"context"
	"os"
)

// kernelZero is Linux only; elsewhere devices are zeroed by writing.
func kernelZero(context.Context, *os.File, int64) (int64, error) { return 0, errNoKernelZero }
