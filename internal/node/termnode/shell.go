package termnode

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
)

// passwdFile is where loginShell reads users' shells.
const passwdFile = "/etc/passwd"

// defaultShell is the shell of a user whose passwd entry names none.
const defaultShell = "/bin/sh"

// loginShell returns name's login shell from the passwd file at path (the
// seventh field); defaultShell when the file, the user or the field is
// missing or the field is not an absolute path. os/user does not expose the
// shell.
func loginShell(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return defaultShell
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 7 || fields[0] != name {
			continue
		}
		if shell := strings.TrimSpace(fields[6]); filepath.IsAbs(shell) {
			return shell
		}
		break
	}
	return defaultShell
}
