//go:build !linux

package pgtest

import (
	"os/exec"
	"os/user"
)

// runAs makes cmd run as u (nil: the current user) through runuser(1).
func runAs(cmd *exec.Cmd, u *user.User) error {
	if u == nil {
		return nil
	}
	args := append([]string{"-u", u.Username, "--", cmd.Path}, cmd.Args[1:]...)
	c := exec.Command("runuser", args...)
	cmd.Path, cmd.Args, cmd.Err = c.Path, c.Args, c.Err
	return nil
}
