//go:build !linux

package exepages

// Trim is a no-op outside Linux.
func Trim() (Result, error) { return Result{}, ErrUnsupported }
