//go:build !linux

package qemu

import (
	"context"
	"errors"
)

// setupTap: tap networking is implemented for Linux (iproute2) only.
func setupTap(context.Context, string, string) error {
	return errors.New("tap networking is only supported on linux")
}

func removeTap(context.Context, string) error { return nil }
