//go:build !linux

package docker

import "errors"

// mountSecrets: only Linux has the tmpfs the secrets need.
func mountSecrets(string) error {
	return errors.New("container secrets need a Linux tmpfs")
}

// unmountSecrets: nothing was mounted.
func unmountSecrets(string) error { return nil }
