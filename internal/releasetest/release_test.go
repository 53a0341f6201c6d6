// Package releasetest checks what scripts/release ships: the archives and
// their checksums, the .rpm packages, the .deb packages installed with dpkg
// (CI only: it changes the machine) and the container image built and run
// with podman. The release is built once, for every target, into a
// temporary directory; -short skips all of it.
//
// A missing tool (rpm, dpkg-deb, podman, zip) skips its test, and fails it
// under CI=true (.ci/run installs them).
package releasetest

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/pe"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testVersion is the release version the tests build; its packages are
// version 0.9.0~test.1.
const testVersion = "v0.9.0-test.1"

var (
	releaseOnce sync.Once
	releaseDir  string
	releaseErr  error
	releaseTook time.Duration
)

// repoRoot is the repository's root (this package is internal/releasetest).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// need skips the test when a tool is missing, or fails it under CI=true.
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed (CI installs it: .ci/run)", tool)
		}
	}
}

// release runs scripts/release once for every target (archives and
// packages) and returns its output directory.
func release(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds every release target (-short)")
	}
	need(t, "go", "git", "tar", "gzip", "zip", "sha256sum")
	releaseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "drover-release-test-")
		if err != nil {
			releaseErr = err
			return
		}
		releaseDir = filepath.Join(dir, "dist")
		start := time.Now()
		cmd := exec.Command("./scripts/release", "--version", testVersion, "--out", releaseDir)
		cmd.Dir = repoRoot(t)
		out, err := cmd.CombinedOutput()
		releaseTook = time.Since(start)
		if err != nil {
			releaseErr = fmt.Errorf("scripts/release: %w\n%s", err, out)
		}
	})
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	t.Logf("scripts/release took %s (once for all tests)", releaseTook.Round(time.Second))
	return releaseDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if releaseDir != "" {
		os.RemoveAll(filepath.Dir(releaseDir))
	}
	os.Exit(code)
}

// run runs a command and returns its combined output, failing the test on
// error.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestReleaseArchives checks SHA256SUMS against every file and that each
// archive holds the binaries of its GOOS/GOARCH (ELF machine, PE machine).
func TestReleaseArchives(t *testing.T) {
	dir := release(t)
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: sha256 %x, SHA256SUMS says %s", name, got, sum)
		}
		listed[name] = true
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != "SHA256SUMS" && !listed[e.Name()] {
			t.Errorf("%s is not in SHA256SUMS", e.Name())
		}
	}
	prefix := "drover_" + testVersion + "_"
	for _, tc := range []struct {
		target string
		bins   []string
	}{
		{"linux_amd64.tar.gz", []string{"drover", "drover-agent"}},
		{"linux_arm64.tar.gz", []string{"drover", "drover-agent"}},
		{"dragonfly_amd64.tar.gz", []string{"drover-agent"}},
		{"windows_amd64.zip", []string{"drover-agent.exe"}},
	} {
		name := prefix + tc.target
		if !listed[name] {
			t.Errorf("%s is missing from the release", name)
			continue
		}
		files := readArchive(t, filepath.Join(dir, name))
		goos, goarch, _ := strings.Cut(strings.TrimSuffix(strings.TrimSuffix(tc.target, ".tar.gz"), ".zip"), "_")
		top := strings.TrimSuffix(strings.TrimSuffix(name, ".tar.gz"), ".zip") + "/"
		for _, bin := range tc.bins {
			data, ok := files[top+bin]
			if !ok {
				t.Errorf("%s lacks %s", name, top+bin)
				continue
			}
			if err := checkBinary(data, goos, goarch); err != nil {
				t.Errorf("%s: %s: %v", name, bin, err)
			}
		}
		if _, ok := files[top+"README.md"]; !ok {
			t.Errorf("%s lacks README.md", name)
		}
		if goos != "windows" {
			for _, f := range []string{"deploy/systemd/drover-agent.service", "deploy/drover-agent.env", "deploy/install-node-agent.sh"} {
				if _, ok := files[top+f]; !ok {
					t.Errorf("%s lacks %s", name, f)
				}
			}
		}
	}
}

// readArchive returns the regular files of a .tar.gz or .zip by name.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	if strings.HasSuffix(path, ".zip") {
		zr, err := zip.OpenReader(path)
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		for _, f := range zr.File {
			rc, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			files[f.Name] = data
		}
		return files
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s owned by %d:%d, want 0:0", path, h.Name, h.Uid, h.Gid)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = data
	}
	return files
}

// checkBinary checks an executable's format and machine: ELF for Unix
// (statically linked: no interpreter), PE for Windows.
func checkBinary(data []byte, goos, goarch string) error {
	if goos == "windows" {
		f, err := pe.NewFile(bytes.NewReader(data))
		if err != nil {
			return fmt.Errorf("not a PE executable: %w", err)
		}
		if goarch == "amd64" && f.Machine != pe.IMAGE_FILE_MACHINE_AMD64 {
			return fmt.Errorf("PE machine %#x, want amd64", f.Machine)
		}
		return nil
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
	if f.Machine != want {
		return fmt.Errorf("ELF machine %v, want %v", f.Machine, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked (has an interpreter); want static (CGO_ENABLED=0)")
		}
	}
	return nil
}

// packageFile returns the path of the release's package matching glob.
func packageFile(t *testing.T, dir, glob string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, glob))
	if len(m) != 1 {
		t.Fatalf("want one %s in %s, found %v", glob, dir, m)
	}
	return m[0]
}

// TestRPMPackages inspects the .rpm packages with rpm -qp: version,
// architecture, files, config files and scriptlets that start nothing.
func TestRPMPackages(t *testing.T) {
	dir := release(t)
	need(t, "rpm")
	for _, tc := range []struct {
		name   string
		files  []string
		config string
	}{
		{"drover-agent", []string{"/usr/bin/drover-agent", "/lib/systemd/system/drover-agent.service",
			"/etc/drover-agent/env", "/var/lib/drover-agent"}, "/etc/drover-agent/env"},
		{"drover", []string{"/usr/bin/drover", "/lib/systemd/system/drover.service", "/etc/drover", "/etc/drover/env"}, "/etc/drover/env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rpm := packageFile(t, dir, tc.name+"-0.9.0*.x86_64.rpm")
			if got := run(t, "rpm", "-qp", "--qf", "%{NAME} %{VERSION} %{ARCH}", rpm); got != tc.name+" 0.9.0~test.1 x86_64" {
				t.Errorf("name version arch %q", got)
			}
			list := run(t, "rpm", "-qlp", rpm)
			for _, f := range tc.files {
				if !containsLine(list, f) {
					t.Errorf("%s lacks %s:\n%s", rpm, f, list)
				}
			}
			if got := strings.TrimSpace(run(t, "rpm", "-qp", "--configfiles", rpm)); got != tc.config {
				t.Errorf("config files %q, want %q", got, tc.config)
			}
			checkScripts(t, run(t, "rpm", "-qp", "--scripts", rpm))
		})
	}
}

func containsLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// checkScripts fails when maintainer scripts enable or start a service.
func checkScripts(t *testing.T, scripts string) {
	t.Helper()
	for _, line := range strings.Split(scripts, "\n") {
		code, _, _ := strings.Cut(line, "#")
		for _, bad := range []string{"systemctl enable", "systemctl start", "systemctl restart", "--now",
			"deb-systemd-invoke", "invoke-rc.d", "service "} {
			if strings.Contains(code, bad) {
				t.Errorf("maintainer script line %q starts or enables a service (%q)", line, bad)
			}
		}
	}
	if !strings.Contains(scripts, "systemctl daemon-reload") {
		t.Errorf("maintainer scripts do not reload systemd:\n%s", scripts)
	}
}
