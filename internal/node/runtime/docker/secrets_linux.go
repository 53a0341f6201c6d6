package docker

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mountSecrets makes dir a small tmpfs only root may enter, so secrets
// never touch a disk (an existing mount is kept).
func mountSecrets(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) == nil && unix.Stat(dir+"/..", &parent) == nil && st.Dev != parent.Dev {
		return nil // mounted already (an agent restart)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
		return fmt.Errorf("mount tmpfs (the agent needs root or CAP_SYS_ADMIN for container secrets): %w", err)
	}
	return nil
}

// unmountSecrets unmounts dir's tmpfs (none is fine).
func unmountSecrets(dir string) error {
	err := unix.Unmount(dir, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
