package pgtest

import (
	"fmt"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
)

// runAs makes cmd run as u (nil: the current user) and die with the test
// binary (PR_SET_PDEATHSIG), so a killed test run leaves no postgres behind.
// Credentials are switched directly rather than through runuser(1) so that
// signals reach postgres itself and the death signal applies to it.
func runAs(cmd *exec.Cmd, u *user.User) error {
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if u != nil {
		uid, err := strconv.ParseUint(u.Uid, 10, 32)
		if err != nil {
			return fmt.Errorf("pgtest: user %s: %w", u.Username, err)
		}
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		if err != nil {
			return fmt.Errorf("pgtest: user %s: %w", u.Username, err)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	cmd.SysProcAttr = attr
	return nil
}
