package version

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "m", Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"},
			{Key: "vcs.time", Value: "2025-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		name                  string
		bi                    *debug.BuildInfo
		version, commit, date string
		want                  Info
	}{
		{"no build info", nil, "", "", "",
			Info{Version: "dev", Commit: "unknown", Date: "unknown", GoVersion: runtime.Version()}},
		{"checkout build", vcs, "", "", "",
			Info{Version: "dev", Commit: "abc123", Date: "2025-01-02T03:04:05Z", Modified: true, GoVersion: "go1.99.1"}},
		{"release overrides", vcs, "v1.2.3", "def456", "2026-01-01T00:00:00Z",
			Info{Version: "v1.2.3", Commit: "def456", Date: "2026-01-01T00:00:00Z", Modified: true, GoVersion: "go1.99.1"}},
		{"go install module@version", &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v0.4.0"}}, "", "", "",
			Info{Version: "v0.4.0", Commit: "unknown", Date: "unknown", GoVersion: "go1.99.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.bi, tc.version, tc.commit, tc.date)
			tc.want.OS, tc.want.Arch = runtime.GOOS, runtime.GOARCH
			if got != tc.want {
				t.Errorf("resolve = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestString(t *testing.T) {
	in := Info{Version: "v1.2.3", Commit: "abc", Date: "2025-01-02T03:04:05Z", Modified: true,
		GoVersion: "go1.26.8", OS: "linux", Arch: "arm64"}
	want := "drover v1.2.3\ncommit:     abc (modified)\nbuild date: 2025-01-02T03:04:05Z\n" +
		"go:         go1.26.8\nplatform:   linux/arm64\n"
	if got := in.String("drover"); got != want {
		t.Errorf("String:\n%s\nwant:\n%s", got, want)
	}
}

// TestLinkerOverride builds a tiny program (testdata/printversion) with -ldflags -X and checks the
// release version wins over the build info.
func TestLinkerOverride(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program (-short)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "x")
	cmd := exec.Command("go", "build", "-o", bin, "-ldflags",
		"-X github.com/drover-dev/drover/internal/wire/version.Version=v9.8.7 -X github.com/drover-dev/drover/internal/wire/version.Date=2030-01-01T00:00:00Z", "./testdata/printversion")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"x v9.8.7\n", "build date: 2030-01-01T00:00:00Z\n", "go:         go1.", "platform:   " + runtime.GOOS + "/" + runtime.GOARCH} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
