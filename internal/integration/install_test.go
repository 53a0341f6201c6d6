package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/sdnotify/sdnotifytest"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// repoRoot is the repository root (tests run in internal/integration).
const repoRoot = "../.."

var installer = filepath.Join(repoRoot, "deploy", "install-node-agent.sh")

// shellScripts are the repository's shell scripts: *.sh files and files
// whose #! line runs sh or bash (scripts/*, .ci/run, deploy/rc.d/*).
func shellScripts(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "out", ".drover", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if strings.HasSuffix(path, ".sh") {
			out = append(out, path)
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		line, _ := bufio.NewReader(f).ReadString('\n')
		if strings.HasPrefix(line, "#!") {
			for _, sh := range []string{"/sh", " sh", "/bash", " bash", "/dash"} {
				if strings.HasSuffix(strings.TrimSpace(line), sh) || strings.Contains(line, sh+" ") {
					out = append(out, path)
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestInstallShellcheck: every shell script passes shellcheck (sh scripts
// as POSIX sh, by their #! line).
func TestInstallShellcheck(t *testing.T) {
	requirePrograms(t, "the shell script check", "shellcheck", "shellcheck")
	scripts := shellScripts(t)
	for _, want := range []string{"scripts/test", "deploy/install-node-agent.sh", "deploy/rc.d/drover_agent"} {
		found := false
		for _, s := range scripts {
			found = found || strings.HasSuffix(s, want)
		}
		if !found {
			t.Fatalf("%s is not among the scripts found: %q", want, scripts)
		}
	}
	for _, s := range scripts {
		out, err := exec.Command("shellcheck", "--external-sources", s).CombinedOutput()
		if err != nil {
			t.Errorf("shellcheck %s: %v\n%s", s, err, out)
		}
	}
	t.Logf("shellcheck passed: %s", strings.Join(scripts, " "))
}

// TestInstallSystemdVerify: systemd-analyze verify accepts both units
// without a warning. It checks that ExecStart's binary exists, so the
// units are verified as installed under a temporary prefix: the same files
// with /usr/local/bin replaced by a directory holding the built binaries.
func TestInstallSystemdVerify(t *testing.T) {
	requirePrograms(t, "the unit file check", "systemd", "systemd-analyze")
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"drover": buildDrover(t), "drover-agent": buildAgent(t)} {
		if err := os.Symlink(src, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	var units []string
	for _, u := range []string{"drover-agent.service", "drover.service"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "systemd", u))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Type=notify", "NotifyAccess=main", "WatchdogSec=", "Restart=on-failure",
			"RestartSec=", "StateDirectory=", "LoadCredential=", "Environment=DROVER_LOG_FORMAT=json"} {
			if !bytes.Contains(b, []byte("\n"+want)) {
				t.Errorf("%s: no %s", u, want)
			}
		}
		p := filepath.Join(dir, u)
		if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte("/usr/local/bin/"), []byte(bin+"/")), 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, p)
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// runInstaller runs the installer with args and the extra environment.
func runInstaller(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{installer}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// agentDir is a directory holding the built drover-agent (--from-dir).
func agentDir(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "drover-agent"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

var (
	armOnce sync.Once
	armBin  string
	armErr  error
)

// TestInstallerStaged runs the installer into a temporary root: twice (the
// second run keeps the env file an operator edited), with a binary of the
// wrong architecture, without --from-dir, with --help, then --uninstall
// (state kept) and --uninstall --purge; and the DragonFlyBSD layout.
func TestInstallerStaged(t *testing.T) {
	from := agentDir(t, buildAgent(t))
	root := filepath.Join(t.TempDir(), "root")

	out, err := runInstaller(t, nil, "--help", "--root", root)
	if err != nil || !strings.Contains(out, "Usage:") || exists(root) {
		t.Fatalf("--help: %v, root created %v\n%s", err, exists(root), out)
	}
	out, err = runInstaller(t, nil, "--root", root)
	if err == nil || !strings.Contains(out, "--from-dir DIR") {
		t.Fatalf("without --from-dir: %v\n%s", err, out)
	}

	out, err = runInstaller(t, nil, "--root", root, "--from-dir", from)
	if err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	for _, want := range []string{"systemctl enable --now drover-agent", "drover hosts create", "NODE_AGENT_BOOTSTRAP_TOKEN"} {
		if !strings.Contains(out, want) {
			t.Errorf("next steps do not say %q:\n%s", want, out)
		}
	}
	env := filepath.Join(root, "etc/drover-agent/env")
	unit := filepath.Join(root, "etc/systemd/system/drover-agent.service")
	for path, want := range map[string]fs.FileMode{filepath.Join(root, "usr/local/bin/drover-agent"): 0o755,
		filepath.Join(root, "var/lib/drover-agent"): 0o700, env: 0o600, unit: 0o644} {
		if got := mode(t, path); got != want {
			t.Errorf("%s: mode %o, want %o", path, got, want)
		}
	}
	tmpl, _ := os.ReadFile(env)
	for _, key := range []string{"NODE_AGENT_CONTROL_PLANE_URL", "NODE_AGENT_HOST_ID", "NODE_AGENT_BOOTSTRAP_TOKEN",
		"NODE_AGENT_CA_HASH", "NODE_AGENT_QEMU_ACCEL", "NODE_AGENT_STATE_DIR"} {
		if !strings.Contains(string(tmpl), "#"+key+"=") {
			t.Errorf("env template does not list %s", key)
		}
	}

	// The operator edits the env file; a second run keeps it.
	edited := append(tmpl, "NODE_AGENT_HOST_ID=edited-by-operator\n"...)
	if err := os.WriteFile(env, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = runInstaller(t, nil, "--root", root, "--from-dir", from)
	if err != nil || !strings.Contains(out, "kept the existing env file") {
		t.Fatalf("second install: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(env); !bytes.Equal(b, edited) {
		t.Fatal("the second run changed the operator's env file")
	}

	// A binary for another architecture is refused before anything changes.
	armOnce.Do(func() {
		dir, err := os.MkdirTemp("", "drover-agent-arm64-")
		if err != nil {
			armErr = err
			return
		}
		armBin = filepath.Join(dir, "drover-agent")
		cmd := exec.Command("go", "build", "-o", armBin, "../../cmd/drover-agent")
		cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			armErr = err
			t.Logf("%s", b)
		}
	})
	if armErr != nil {
		t.Fatal(armErr)
	}
	host := map[string]string{"x86_64": "amd64", "aarch64": "arm64"}[unameM(t)]
	wrong := agentDir(t, armBin)
	if host == "arm64" {
		t.Skip("the mismatch case needs a non-arm64 host") // the arm64 build is this host's
	}
	out, err = runInstaller(t, nil, "--root", root, "--from-dir", wrong)
	want := string(signal.BinaryInvalid) + ": expected " + host + ", found arm64"
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("arm64 binary: %v, want %q in\n%s", err, want, out)
	}

	out, err = runInstaller(t, nil, "--root", root, "--uninstall")
	if err != nil || exists(filepath.Join(root, "usr/local/bin/drover-agent")) || exists(unit) ||
		!exists(env) || !exists(filepath.Join(root, "var/lib/drover-agent")) {
		t.Fatalf("uninstall: %v (state and env must stay, binary and unit go)\n%s", err, out)
	}
	out, err = runInstaller(t, nil, "--root", root, "--uninstall", "--purge")
	if err != nil || exists(env) || exists(filepath.Join(root, "var/lib/drover-agent")) {
		t.Fatalf("purge: %v\n%s", err, out)
	}

	// DragonFlyBSD: the rc.d script and the env file under the prefix.
	df := filepath.Join(t.TempDir(), "df")
	out, err = runInstaller(t, []string{"DROVER_INSTALL_UNAME_S=DragonFly"}, "--root", df, "--from-dir", from)
	if err != nil || !strings.Contains(out, "drover_agent_enable=YES") {
		t.Fatalf("DragonFly layout: %v\n%s", err, out)
	}
	if got := mode(t, filepath.Join(df, "usr/local/etc/rc.d/drover_agent")); got != 0o755 {
		t.Errorf("rc.d script mode %o", got)
	}
	if got := mode(t, filepath.Join(df, "usr/local/etc/drover-agent/env")); got != 0o600 {
		t.Errorf("DragonFly env file mode %o", got)
	}
}

func unameM(t *testing.T) string {
	t.Helper()
	b, err := exec.Command("uname", "-m").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// unitValues are the values of key= lines in a unit file, in order.
func unitValues(unit []byte, key string) []string {
	var out []string
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), key+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// envFileVars are the KEY=VALUE lines of an env file (as systemd's
// EnvironmentFile= reads the simple ones).
func envFileVars(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") || !strings.Contains(l, "=") {
			continue
		}
		out = append(out, l)
	}
	return out
}

// TestInstalledAgentUnderUnit: the installer stages the agent; the env
// file gets what POST /api/v1/hosts gives; the agent runs with exactly the
// unit's ExecStart line (under the staged root) and the variables of its
// Environment= and EnvironmentFile= lines, as systemd would start it with
// a notify socket; it says READY=1, logs JSON, enrols and heartbeats
// against a real `drover dev`.
func TestInstalledAgentUnderUnit(t *testing.T) {
	d := startDev(t, 500*time.Millisecond)
	const id = "installed-node"
	var bt api.BootstrapToken
	if st := d.op(http.MethodPost, "/api/v1/hosts", api.CreateHostRequest{HostID: id, OSFamily: "linux"}, &bt); st != http.StatusCreated {
		t.Fatalf("create host: %d", st)
	}
	root := filepath.Join(t.TempDir(), "root")
	if out, err := runInstaller(t, nil, "--root", root, "--from-dir", agentDir(t, buildAgent(t))); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/drover-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	execStart, envFiles := unitValues(unit, "ExecStart"), unitValues(unit, "EnvironmentFile")
	if len(execStart) != 1 || len(envFiles) != 1 {
		t.Fatalf("ExecStart %q, EnvironmentFile %q: want one each", execStart, envFiles)
	}
	envFile := filepath.Join(root, strings.TrimPrefix(envFiles[0], "-"))

	// What the operator writes into the installed env file.
	f, err := os.OpenFile(envFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"NODE_AGENT_CONTROL_PLANE_URL=" + bt.NodeURL, "NODE_AGENT_HOST_ID=" + id,
		"NODE_AGENT_BOOTSTRAP_TOKEN=" + bt.Token, "NODE_AGENT_CA_HASH=" + bt.CAHash,
		// Staged: the state dir under the root, a local API on any free port, no
		// instances (no QEMU needed).
		"NODE_AGENT_STATE_DIR=" + filepath.Join(root, "var/lib/drover-agent"),
		"NODE_AGENT_LISTEN=127.0.0.1:0", "NODE_AGENT_RUNTIME=none", "NODE_AGENT_HEARTBEAT_INTERVAL=500ms"} {
		if _, err := f.WriteString(kv + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	argv := strings.Fields(execStart[0])
	argv[0] = filepath.Join(root, argv[0])
	sock := sdnotifytest.Listen(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "NOTIFY_SOCKET=" + sock.Path, "WATCHDOG_USEC=2000000"}
	env = append(env, unitValues(unit, "Environment")...)
	env = append(env, envFileVars(t, envFile)...)
	logPath := filepath.Join(t.TempDir(), "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr, cmd.Dir = env, logf, logf, "/"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("installed agent's log:\n%s", b)
		}
	})

	m, _ := sock.Wait(t, "READY=1", 60*time.Second)
	if !strings.Contains(m, "STATUS=node "+id) {
		t.Errorf("READY=1 without the node's status: %q", m)
	}
	first := d.waitStatus(id, api.HostHealthy, 60*time.Second)
	if first.LastSeenAt == nil {
		t.Fatalf("healthy without a heartbeat: %+v", first)
	}
	// It keeps heartbeating: last_seen_at moves on.
	deadline := time.Now().Add(20 * time.Second)
	for {
		h := d.waitStatus(id, api.HostHealthy, 10*time.Second)
		if h.LastSeenAt != nil && h.LastSeenAt.After(*first.LastSeenAt) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat after the first (last_seen_at %s)", first.LastSeenAt)
		}
		time.Sleep(200 * time.Millisecond)
	}
	sock.Wait(t, "WATCHDOG=1", 10*time.Second)

	// journald gets JSON: every log line is one object.
	b, _ := os.ReadFile(logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line is not JSON (DROVER_LOG_FORMAT=json from the unit): %q", l)
		}
	}
	if !strings.Contains(string(b), `"msg":"agent running"`) {
		t.Errorf("no agent running record in %d log lines", len(lines))
	}
	_ = cmd.Process.Signal(os.Interrupt)
	sock.Wait(t, "STOPPING=1", 10*time.Second)
}
