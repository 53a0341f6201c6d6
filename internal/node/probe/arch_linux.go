//go:build linux

package probe

import "golang.org/x/sys/unix"

// hostMachine is uname's machine field.
func hostMachine() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(u.Machine[:]), nil
}
