// Package version is the build's identity, shared by drover and
// drover-agent: the version, the commit and its time, whether the tree was
// modified, and the Go toolchain, read from the build info the Go linker
// embeds (runtime/debug.ReadBuildInfo). Releases override the version (and
// may override the commit and date) with the linker:
//
//	go build -ldflags "-X github.com/drover-dev/drover/internal/wire/version.Version=v1.2.3" ./cmd/drover
//
// It imports nothing of Drover and nothing outside the standard library.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set with -ldflags "-X github.com/drover-dev/drover/internal/wire/version.NAME=VALUE";
// empty means "from the build info".
var (
	// Version is the release version, e.g. v1.2.3.
	Version = ""
	// Commit is the VCS revision (default: the build info's vcs.revision).
	Commit = ""
	// Date is the build date, RFC 3339 (default: the build info's vcs.time,
	// the commit's time, which keeps builds reproducible).
	Date = ""
)

// Info describes one build.
type Info struct {
	Version   string // release version, the module version, or "dev"
	Commit    string // VCS revision; "unknown" when not recorded
	Date      string // RFC 3339; "unknown" when not recorded
	Modified  bool   // the working tree had uncommitted changes
	GoVersion string // e.g. go1.26.8
	OS, Arch  string // runtime.GOOS, runtime.GOARCH
}

// Get returns this binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(bi, Version, Commit, Date)
}

// resolve builds an Info from the build info (nil when unavailable) and the
// linker overrides.
func resolve(bi *debug.BuildInfo, version, commit, date string) Info {
	in := Info{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH}
	if bi != nil {
		if bi.GoVersion != "" {
			in.GoVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if in.Commit == "" {
					in.Commit = s.Value
				}
			case "vcs.time":
				if in.Date == "" {
					in.Date = s.Value
				}
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
		// `go install module@version` records the module version; a build
		// in a checkout records "(devel)" or a VCS pseudo-version.
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
	}
	if in.Version == "" {
		in.Version = "dev"
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	if in.Date == "" {
		in.Date = "unknown"
	}
	return in
}

// Short is the version alone, as agents report it to the control plane.
func Short() string { return Get().Version }

// String is the multi-line text `drover version` and `drover-agent
// -version` print, headed by the program's name:
//
//	drover v1.2.3
//	commit:     0123abcd… (modified)
//	build date: 2025-01-02T03:04:05Z
//	go:         go1.26.8
//	platform:   linux/amd64
func (in Info) String(program string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", program, in.Version)
	commit := in.Commit
	if in.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(&b, "commit:     %s\n", commit)
	fmt.Fprintf(&b, "build date: %s\n", in.Date)
	fmt.Fprintf(&b, "go:         %s\n", in.GoVersion)
	fmt.Fprintf(&b, "platform:   %s/%s\n", in.OS, in.Arch)
	return b.String()
}
