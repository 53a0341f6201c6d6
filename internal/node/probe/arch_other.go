//go:build !linux

package probe

import "errors"

// hostMachine is not read on this OS.
func hostMachine() (string, error) { return "", errors.New("uname is read on Linux only") }
