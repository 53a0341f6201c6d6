package probe

import (
	"fmt"
	"runtime"
)

// goarchOf maps a kernel's machine name (uname -m) to GOARCH.
func goarchOf(machine string) string {
	switch machine {
	case "x86_64", "amd64":
		return "amd64"
	case "aarch64", "arm64", "aarch64_be":
		return "arm64"
	case "i386", "i486", "i586", "i686", "x86":
		return "386"
	case "armv6l", "armv7l", "armv8l", "arm":
		return "arm"
	case "ppc64le", "ppc64", "s390x", "riscv64", "mips64", "loong64":
		return machine
	}
	return ""
}

// BinaryMatchesHost checks that this binary was built for the host's
// architecture (it may run under emulation otherwise). ok is false on a
// mismatch; detail says what was compared, or why nothing was.
func BinaryMatchesHost() (ok bool, detail string) {
	machine, err := hostMachine()
	if err != nil {
		return true, fmt.Sprintf("built for %s/%s; host architecture unknown (%v)", runtime.GOOS, runtime.GOARCH, err)
	}
	return MatchMachine(runtime.GOARCH, machine)
}

// MatchMachine compares goarch with a kernel machine name.
func MatchMachine(goarch, machine string) (bool, string) {
	want := goarchOf(machine)
	switch {
	case want == "":
		return true, fmt.Sprintf("built for %s; host machine %q not recognised", goarch, machine)
	case want != goarch:
		return false, fmt.Sprintf("agent built for %s but the host is %s (%s): running under emulation or the wrong package", goarch, want, machine)
	}
	return true, fmt.Sprintf("agent built for %s on a %s host", goarch, machine)
}
