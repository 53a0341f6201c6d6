package releasetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// dpkgAllowed skips unless the machine may be changed: dpkg -i installs
// into the real system, so it runs under CI=true (a throw-away machine) or
// with DROVER_TEST_DPKG=1, as root.
func dpkgAllowed(t *testing.T) {
	t.Helper()
	if os.Getenv("CI") != "true" && os.Getenv("DROVER_TEST_DPKG") != "1" {
		t.Skip("installs .deb packages into this machine with dpkg -i: runs under CI=true or DROVER_TEST_DPKG=1")
	}
	if runtime.GOARCH != "amd64" {
		t.Skipf("the test installs the amd64 packages; this machine is %s", runtime.GOARCH)
	}
	need(t, "dpkg", "dpkg-deb")
	if os.Geteuid() != 0 {
		t.Fatal("dpkg -i needs root")
	}
}

// installDeb checks the package is not installed yet, installs it and
// purges it at the end whatever happens.
func installDeb(t *testing.T, name, deb string) {
	t.Helper()
	if exec.Command("dpkg", "-s", name).Run() == nil {
		t.Fatalf("%s is already installed on this machine; the test installs and purges its own", name)
	}
	t.Cleanup(func() { _ = exec.Command("dpkg", "--purge", name).Run() })
	run(t, "dpkg", "-i", deb)
}

// checkVersionOutput checks `-version` / `version` output: release version,
// commit, build date, Go version and platform.
func checkVersionOutput(t *testing.T, program, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || lines[0] != program+" "+testVersion ||
		!strings.HasPrefix(lines[1], "commit:") || strings.Contains(lines[1], "unknown") ||
		!strings.HasPrefix(lines[2], "build date:") || strings.Contains(lines[2], "unknown") ||
		lines[3] != "go:         "+runtime.Version() || lines[4] != "platform:   linux/amd64" {
		t.Errorf("%s version printed:\n%s", program, out)
	}
}

// checkNotEnabled checks the unit is not enabled (no .wants link) and the
// binary is not running.
func checkNotEnabled(t *testing.T, unit, bin string) {
	t.Helper()
	links, _ := filepath.Glob("/etc/systemd/system/*.wants/" + unit)
	if len(links) > 0 {
		t.Errorf("%s was enabled by the package: %v", unit, links)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		if exe, err := os.Readlink(p); err == nil && exe == bin {
			t.Errorf("%s is running (%s) after install", bin, p)
		}
	}
}

func exists(path string) bool { _, err := os.Lstat(path); return err == nil }

// TestDebAgent inspects the drover-agent .deb, installs it with dpkg -i,
// runs drover-agent -version from it, checks the unit landed and nothing
// started, and purges it.
func TestDebAgent(t *testing.T) {
	dpkgAllowed(t)
	deb := packageFile(t, release(t), "drover-agent_0.9.0*_amd64.deb")
	info := run(t, "dpkg-deb", "-I", deb)
	for _, want := range []string{"Package: drover-agent", "Version: 0.9.0~test.1", "Architecture: amd64"} {
		if !strings.Contains(info, want) {
			t.Errorf("dpkg-deb -I lacks %q:\n%s", want, info)
		}
	}
	if got := strings.TrimSpace(run(t, "dpkg-deb", "-I", deb, "conffiles")); got != "/etc/drover-agent/env" {
		t.Errorf("conffiles %q, want /etc/drover-agent/env", got)
	}
	contents := run(t, "dpkg-deb", "-c", deb)
	for _, f := range []string{"./usr/bin/drover-agent", "./lib/systemd/system/drover-agent.service",
		"./etc/drover-agent/env", "./var/lib/drover-agent/"} {
		if !strings.Contains(contents, " "+f+"\n") {
			t.Errorf("dpkg-deb -c lacks %s:\n%s", f, contents)
		}
	}
	if !strings.Contains(contents, "-rw------- root/root") {
		t.Errorf("the env file (it holds the bootstrap token) is not mode 0600:\n%s", contents)
	}
	ctrl := t.TempDir()
	run(t, "dpkg-deb", "-e", deb, ctrl)
	var scripts strings.Builder
	for _, s := range []string{"preinst", "postinst", "prerm", "postrm"} {
		if b, err := os.ReadFile(filepath.Join(ctrl, s)); err == nil {
			scripts.Write(b)
		}
	}
	checkScripts(t, scripts.String())

	installDeb(t, "drover-agent", deb)
	checkVersionOutput(t, "drover-agent", run(t, "/usr/bin/drover-agent", "-version"))
	unit, err := os.ReadFile("/lib/systemd/system/drover-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/bin/drover-agent") {
		t.Errorf("the packaged unit does not run /usr/bin/drover-agent:\n%s", unit)
	}
	if st, err := os.Stat("/etc/drover-agent/env"); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("/etc/drover-agent/env: %v %v, want mode 0600", st, err)
	}
	checkNotEnabled(t, "drover-agent.service", "/usr/bin/drover-agent")

	run(t, "dpkg", "--purge", "drover-agent")
	for _, p := range []string{"/usr/bin/drover-agent", "/lib/systemd/system/drover-agent.service",
		"/etc/drover-agent", "/var/lib/drover-agent"} {
		if exists(p) {
			t.Errorf("%s is left after dpkg --purge", p)
		}
	}
}

// TestDebControlPlane installs the drover .deb: the drover system user and
// its state directory are created, nothing starts; dpkg -r keeps the user
// and state, dpkg --purge removes them.
func TestDebControlPlane(t *testing.T) {
	dpkgAllowed(t)
	deb := packageFile(t, release(t), "drover_0.9.0*_amd64.deb")
	if exec.Command("getent", "passwd", "drover").Run() == nil {
		t.Fatal("a drover user exists on this machine already; the test creates and removes its own")
	}
	contents := run(t, "dpkg-deb", "-c", deb)
	for _, f := range []string{"./usr/bin/drover", "./lib/systemd/system/drover.service", "./etc/drover/env"} {
		if !strings.Contains(contents, " "+f+"\n") {
			t.Errorf("dpkg-deb -c lacks %s:\n%s", f, contents)
		}
	}
	if got := strings.TrimSpace(run(t, "dpkg-deb", "-I", deb, "conffiles")); got != "/etc/drover/env" {
		t.Errorf("conffiles %q, want /etc/drover/env", got)
	}
	installDeb(t, "drover", deb)
	if got := strings.TrimSpace(run(t, "stat", "-c", "%U:%G %a", "/etc/drover/env")); got != "root:drover 640" {
		t.Errorf("/etc/drover/env is %s, want root:drover 640", got)
	}
	checkVersionOutput(t, "drover", run(t, "/usr/bin/drover", "version"))
	pw := strings.Split(strings.TrimSpace(run(t, "getent", "passwd", "drover")), ":")
	if len(pw) != 7 || pw[5] != "/var/lib/drover" || !strings.HasSuffix(pw[6], "nologin") {
		t.Errorf("drover user %v: want home /var/lib/drover and a nologin shell", pw)
	}
	if got := strings.TrimSpace(run(t, "stat", "-c", "%U:%G %a", "/var/lib/drover")); got != "drover:drover 700" {
		t.Errorf("/var/lib/drover is %s, want drover:drover 700", got)
	}
	checkNotEnabled(t, "drover.service", "/usr/bin/drover")

	if err := os.WriteFile("/var/lib/drover/drover.db", []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "dpkg", "-r", "drover")
	if exists("/usr/bin/drover") || !exists("/var/lib/drover/drover.db") || exec.Command("getent", "passwd", "drover").Run() != nil {
		t.Error("dpkg -r: want the binary removed and the state and user kept")
	}
	run(t, "dpkg", "--purge", "drover")
	if exists("/var/lib/drover") || exists("/etc/drover") || exec.Command("getent", "passwd", "drover").Run() == nil {
		t.Error("dpkg --purge: want /var/lib/drover, /etc/drover and the drover user removed")
	}
}
