package agent_test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/drover-dev/drover/internal/node/agent"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
)

// testRuntimes is the registry the tests' configurations are loaded with:
// drover-agent's (qemu) plus the mock.
var testRuntimes = noderuntime.Registry{qemu.Name: qemu.Entry(), mock.Name: mock.Entry()}

// loadConfig is agent.LoadConfig with testRuntimes and no default env
// file (the host's /etc/drover-agent/env must not change the tests).
func loadConfig(args []string, getenv func(string) string) (agent.Config, error) {
	return agent.LoadConfig(args, getenv, testRuntimes, agent.WithDefaultEnvFile(""))
}

// env returns a getenv over m.
func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// writeConfigFile writes content to a fresh file and returns its path.
func writeConfigFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.env")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfigPrecedence(t *testing.T) {
	t.Parallel()
	file := writeConfigFile(t, strings.Join([]string{
		"NODE_AGENT_CONTROL_PLANE_URL=https://file.example:8443",
		"NODE_AGENT_HOST_ID=host-file",
		"NODE_AGENT_BOOTSTRAP_TOKEN=tok-file",
		"NODE_AGENT_STATE_DIR=/file/state",
		"NODE_AGENT_HEARTBEAT_INTERVAL=1s",
	}, "\n"))
	fileEnv := map[string]string{"NODE_AGENT_CONFIG": file}
	envVars := map[string]string{
		"NODE_AGENT_CONFIG":             file,
		"NODE_AGENT_CONTROL_PLANE_URL":  "https://env.example:8443",
		"NODE_AGENT_HOST_ID":            "host-env",
		"NODE_AGENT_HEARTBEAT_INTERVAL": "2s",
		"NODE_AGENT_BOOTSTRAP_TOKEN":    "", // empty variables do not override
	}
	flags := []string{"-control-plane-url", "https://flag.example:8443", "-heartbeat-interval", "3s"}

	cases := []struct {
		name      string
		args      []string
		env       map[string]string
		url, host string
		token     string
		stateDir  string
		heartbeat time.Duration
	}{
		{"file only (NODE_AGENT_CONFIG)", nil, fileEnv,
			"https://file.example:8443", "host-file", "tok-file", "/file/state", time.Second},
		{"file only (-config)", []string{"-config", file}, nil,
			"https://file.example:8443", "host-file", "tok-file", "/file/state", time.Second},
		{"env over file", nil, envVars,
			"https://env.example:8443", "host-env", "tok-file", "/file/state", 2 * time.Second},
		{"flags over env over file", flags, envVars,
			"https://flag.example:8443", "host-env", "tok-file", "/file/state", 3 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, env(tc.env))
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			if c.ControlPlaneURL != tc.url || c.HostID != tc.host || c.BootstrapToken != tc.token ||
				c.StateDir != tc.stateDir || c.HeartbeatInterval != tc.heartbeat {
				t.Errorf("got url=%q host=%q token=%q state=%q heartbeat=%s\nwant url=%q host=%q token=%q state=%q heartbeat=%s",
					c.ControlPlaneURL, c.HostID, c.BootstrapToken, c.StateDir, c.HeartbeatInterval,
					tc.url, tc.host, tc.token, tc.stateDir, tc.heartbeat)
			}
		})
	}

	t.Run("-config flag over NODE_AGENT_CONFIG", func(t *testing.T) {
		c, err := loadConfig([]string{"-config", file},
			env(map[string]string{"NODE_AGENT_CONFIG": filepath.Join(t.TempDir(), "missing.env")}))
		if err != nil {
			t.Fatalf("LoadConfig: %v", err)
		}
		if c.HostID != "host-file" {
			t.Errorf("HostID = %q, want host-file from the -config file", c.HostID)
		}
	})
}

func TestLoadConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := loadConfig([]string{"-control-plane-url", "https://cp.example:8443"}, env(nil))
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	wantState, wantOS := "/var/lib/drover-agent", "linux"
	switch runtime.GOOS {
	case "windows":
		wantState, wantOS = `C:\ProgramData\drover-agent`, "windows"
	case "darwin":
		wantOS = "darwin"
	case "dragonfly":
		wantOS = "dragonflybsd"
	}
	if c.StateDir != wantState || c.OSFamily != wantOS || c.ListenAddr != "127.0.0.1:9000" ||
		c.HeartbeatInterval != 0 || c.HostID != "" || c.ReservedVCPUs != 0 || c.ReservedMemoryMiB != 0 {
		t.Errorf("defaults = %+v, want state %q, os %q, listen 127.0.0.1:9000, server heartbeat, no host id", c, wantState, wantOS)
	}
}

func TestLoadConfigFileParsing(t *testing.T) {
	t.Parallel()
	file := writeConfigFile(t, `# drover-agent configuration

   # indented comment
export NODE_AGENT_CONTROL_PLANE_URL="https://cp.example:8443"
NODE_AGENT_HOST_ID='gpu-01'
  NODE_AGENT_BOOTSTRAP_TOKEN = tok=with=equals  
NODE_AGENT_CA_HASH=sha256:0011
NODE_AGENT_CA_FILE=/etc/drover/ca.pem
NODE_AGENT_OS_FAMILY=dragonflybsd
NODE_AGENT_QEMU_ACCEL=nvmm
NODE_AGENT_STATE_DIR="/srv/drover agent"
NODE_AGENT_LISTEN=127.0.0.1:9100
NODE_AGENT_HOSTNAME=gpu-01.example
NODE_AGENT_HEARTBEAT_INTERVAL=250ms
NODE_AGENT_RUNTIME=mock
NODE_AGENT_RUNTIME_DIR=/srv/rt
NODE_AGENT_IMAGE_DIRS=/srv/images,/var/lib/libvirt/images
NODE_AGENT_QEMU_BINARY=/opt/qemu/bin/qemu-system-x86_64
NODE_AGENT_SECRETS_DIR=/etc/drover/secrets
NODE_AGENT_RECONCILE_INTERVAL=2s
NODE_AGENT_RESTART_BACKOFF=500ms
NODE_AGENT_RESTART_BACKOFF_MAX=1m
NODE_AGENT_CRASH_LOOP_THRESHOLD=2
NODE_AGENT_TASK_SLOTS=16
NODE_AGENT_TERMINAL_URL=https://term.example:9443
NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS=true
NODE_AGENT_MICROVM_BRIDGE=brvm0
NODE_AGENT_MICROVM_CIDR=172.30.0.0/16
NODE_AGENT_MICROVM_DNS=10.0.0.53, 9.9.9.9
NODE_AGENT_SLICE_CIDR=10.77.0.0/24
NODE_AGENT_SLICE_BRIDGE=brslice0
`)
	c, err := loadConfig([]string{"-config", file}, env(nil))
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	want := agent.Config{ControlPlaneURL: "https://cp.example:8443", HostID: "gpu-01", BootstrapToken: "tok=with=equals",
		CAHash: "sha256:0011", CAFile: "/etc/drover/ca.pem", OSFamily: "dragonflybsd", QEMUAccel: "nvmm",
		StateDir: "/srv/drover agent", ListenAddr: "127.0.0.1:9100", Hostname: "gpu-01.example",
		HeartbeatInterval: 250 * time.Millisecond, Runtime: "mock", RuntimeDir: "/srv/rt",
		ImageDirs: "/srv/images,/var/lib/libvirt/images", RuntimeSettings: map[string]string{"NODE_AGENT_QEMU_BINARY": "/opt/qemu/bin/qemu-system-x86_64"},
		SecretsDir: "/etc/drover/secrets", ReconcileInterval: 2 * time.Second, TerminalURL: "https://term.example:9443",
		RestartBackoff: 500 * time.Millisecond, RestartBackoffMax: time.Minute, CrashLoopThreshold: 2,
		TaskSlots: 16, ImageAllowLocalURLs: true, Local: agent.DefaultLocalWorkloads(),
		MicroVMBridge: "brvm0", MicroVMCIDR: "172.30.0.0/16", MicroVMDNS: "10.0.0.53, 9.9.9.9",
		SliceCIDR: "10.77.0.0/24", SliceBridge: "brslice0"}
	if diff := cmp.Diff(c, want, cmpopts.IgnoreFields(agent.Config{}, "Runtimes")); diff != "" {
		t.Errorf("config (-got +want):\n%s", diff)
	}
	if got := c.Runtimes.Names(); !slices.Equal(got, []string{"mock", "qemu"}) {
		t.Errorf("Runtimes = %v, want LoadConfig's registry (mock, qemu)", got)
	}
}

func TestLoadConfigFileErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		content string
		want    []string // substrings of the error, after the file path
	}{
		{"unknown key names its line", "# comment\nNODE_AGENT_HOST_ID=h1\nNODE_AGENT_BOGUS=1\n",
			[]string{":3:", `unknown key "NODE_AGENT_BOGUS"`}},
		{"line without =", "NODE_AGENT_HOST_ID=h1\njust some words\n", []string{":2:", "want KEY=VALUE"}},
		{"bad heartbeat interval", "NODE_AGENT_HEARTBEAT_INTERVAL=soon\n", []string{":1:", "NODE_AGENT_HEARTBEAT_INTERVAL"}},
		{"bad boolean", "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS=maybe\n", []string{":1:", "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS", "true or false"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file := writeConfigFile(t, tc.content)
			_, err := loadConfig([]string{"-config", file,
				"-control-plane-url", "https://cp.example:8443"}, env(nil))
			if err == nil {
				t.Fatal("LoadConfig accepted a bad config file")
			}
			for _, w := range append([]string{file}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope.env")
		_, err := loadConfig(nil, env(map[string]string{"NODE_AGENT_CONFIG": missing}))
		if err == nil || !strings.Contains(err.Error(), "config file") || !strings.Contains(err.Error(), missing) {
			t.Errorf("error = %v, want a config file error naming %s", err, missing)
		}
	})
}

func TestLoadConfigFlags(t *testing.T) {
	t.Parallel()
	base := []string{"-control-plane-url", "https://cp.example:8443"}
	cases := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(agent.Config) bool
	}{
		{"-node-id is an alias of -host-id", []string{"-node-id", "host-7"}, nil,
			func(c agent.Config) bool { return c.HostID == "host-7" }},
		{"-host-id", []string{"-host-id", "host-8"}, nil,
			func(c agent.Config) bool { return c.HostID == "host-8" }},
		{"-node-id over NODE_AGENT_HOST_ID", []string{"-node-id", "host-9"}, map[string]string{"NODE_AGENT_HOST_ID": "host-env"},
			func(c agent.Config) bool { return c.HostID == "host-9" }},
		{"reserved capacity", []string{"-reserved-vcpus", "2", "-reserved-memory-mib", "1024"}, nil,
			func(c agent.Config) bool { return c.ReservedVCPUs == 2 && c.ReservedMemoryMiB == 1024 }},
		{"local image URLs refused by default", nil, nil,
			func(c agent.Config) bool { return !c.ImageAllowLocalURLs }},
		{"-image-allow-local-urls", []string{"-image-allow-local-urls"}, nil,
			func(c agent.Config) bool { return c.ImageAllowLocalURLs }},
		{"NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS", nil, map[string]string{"NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS": "true"},
			func(c agent.Config) bool { return c.ImageAllowLocalURLs }},
		{"-image-allow-local-urls=false over the environment", []string{"-image-allow-local-urls=false"},
			map[string]string{"NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS": "1"},
			func(c agent.Config) bool { return !c.ImageAllowLocalURLs }},
		{"every string flag", []string{"-bootstrap-token", "t", "-ca-hash", "sha256:00", "-ca-file", "/ca.pem",
			"-os-family", "windows", "-qemu-accel", "tcg", "-state-dir", "/s", "-listen", "127.0.0.1:1", "-hostname", "h"}, nil,
			func(c agent.Config) bool {
				return c.BootstrapToken == "t" && c.CAHash == "sha256:00" && c.CAFile == "/ca.pem" && c.OSFamily == "windows" &&
					c.QEMUAccel == "tcg" && c.StateDir == "/s" && c.ListenAddr == "127.0.0.1:1" && c.Hostname == "h"
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(append(append([]string{}, base...), tc.args...), env(tc.env))
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			if !tc.check(c) {
				t.Errorf("config = %+v", c)
			}
		})
	}
}

func TestLoadConfigValidation(t *testing.T) {
	t.Parallel()
	url := []string{"-control-plane-url", "https://cp.example:8443"}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		file string   // config file content, when set
		want []string // substrings of the error
	}{
		{"control plane URL required", nil, nil, "",
			[]string{"NODE_AGENT_CONTROL_PLANE_URL (-control-plane-url) is required"}},
		{"control plane URL must be https", []string{"-control-plane-url", "http://cp.example:8443"}, nil, "",
			[]string{"NODE_AGENT_CONTROL_PLANE_URL", "http://cp.example:8443", "https://"}},
		{"control plane URL needs a host", nil, map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://"}, "",
			[]string{"NODE_AGENT_CONTROL_PLANE_URL", "https://"}},
		{"terminal URL must be https", url, map[string]string{"NODE_AGENT_TERMINAL_URL": "http://cp.example:8443"}, "",
			[]string{`NODE_AGENT_TERMINAL_URL "http://cp.example:8443"`, "https://"}},
		{"terminal URL needs a host", append([]string{"-terminal-url", "https://"}, url...), nil, "",
			[]string{"NODE_AGENT_TERMINAL_URL"}},
		{"os family", append([]string{"-os-family", "plan9"}, url...), nil, "",
			[]string{"NODE_AGENT_OS_FAMILY", "plan9"}},
		{"host id", url, map[string]string{"NODE_AGENT_HOST_ID": "Bad_Host"}, "",
			[]string{"NODE_AGENT_HOST_ID", "host_id must match"}},
		{"heartbeat below 100ms", append([]string{"-heartbeat-interval", "50ms"}, url...), nil, "",
			[]string{"-heartbeat-interval 50ms", "at least 100ms"}},
		{"negative heartbeat", append([]string{"-heartbeat-interval", "-1s"}, url...), nil, "",
			[]string{"-heartbeat-interval -1s"}},
		{"bad accel fallback", append([]string{"-accel-fallback", "kvm"}, url...), nil, "",
			[]string{`NODE_AGENT_ACCEL_FALLBACK "kvm"`, "tcg or empty"}},
		{"unknown runtime", append([]string{"-runtime", "xen"}, url...), nil, "",
			[]string{`NODE_AGENT_RUNTIME "xen"`, "one of mock, qemu, none"}},
		{"relative image dir", append([]string{"-image-dirs", "/ok,images"}, url...), nil, "",
			[]string{"NODE_AGENT_IMAGE_DIRS", `"images" is not an absolute path`}},
		{"microVM bridge name too long", append([]string{"-microvm-bridge", "a-bridge-too-long"}, url...), nil, "",
			[]string{"NODE_AGENT_MICROVM_BRIDGE", `"a-bridge-too-long"`, "1-15 characters"}},
		{"microVM CIDR too small", url, map[string]string{"NODE_AGENT_MICROVM_CIDR": "10.0.0.0/30"}, "",
			[]string{"NODE_AGENT_MICROVM_CIDR", "/8 to /29"}},
		{"microVM DNS not an IPv4 address", url, nil, "NODE_AGENT_MICROVM_DNS=10.0.0.53,dns.example\n",
			[]string{"NODE_AGENT_MICROVM_DNS", `"dns.example"`, "IPv4"}},
		{"slice CIDR not a CIDR", append([]string{"-slice-cidr", "10.77.0.1"}, url...), nil, "",
			[]string{"NODE_AGENT_SLICE_CIDR", `"10.77.0.1"`}},
		{"slice bridge name too long", url, map[string]string{"NODE_AGENT_SLICE_BRIDGE": "a-bridge-too-long"}, "",
			[]string{"NODE_AGENT_SLICE_BRIDGE", "1-15 characters"}},
		{"relative host root", append([]string{"-host-root", "host"}, url...), nil, "",
			[]string{`NODE_AGENT_HOST_ROOT "host"`, "absolute"}},
		{"reconcile below 100ms", append([]string{"-reconcile-interval", "10ms"}, url...), nil, "",
			[]string{"NODE_AGENT_RECONCILE_INTERVAL 10ms", "at least 100ms"}},
		{"restart backoff below 100ms", url, map[string]string{"NODE_AGENT_RESTART_BACKOFF": "10ms"}, "",
			[]string{"NODE_AGENT_RESTART_BACKOFF 10ms", "at least 100ms"}},
		{"restart backoff max below the backoff", append([]string{"-restart-backoff", "2s", "-restart-backoff-max", "1s"}, url...), nil, "",
			[]string{"NODE_AGENT_RESTART_BACKOFF_MAX 1s", "at least NODE_AGENT_RESTART_BACKOFF"}},
		{"crash loop threshold not a number", url, nil, "NODE_AGENT_CRASH_LOOP_THRESHOLD=many\n",
			[]string{"NODE_AGENT_CRASH_LOOP_THRESHOLD", "many"}},
		{"task slots not a number", url, map[string]string{"NODE_AGENT_TASK_SLOTS": "lots"}, "",
			[]string{"NODE_AGENT_TASK_SLOTS", `"lots"`}},
		{"task slots above the bound", append([]string{"-task-slots", "65"}, url...), nil, "",
			[]string{"NODE_AGENT_TASK_SLOTS 65", "between 1 and 64"}},
		{"heartbeat env not a duration", url, map[string]string{"NODE_AGENT_HEARTBEAT_INTERVAL": "often"}, "",
			[]string{"NODE_AGENT_HEARTBEAT_INTERVAL"}},
		{"state dir emptied by the config file", url, nil, "NODE_AGENT_STATE_DIR=\n",
			[]string{"NODE_AGENT_STATE_DIR is required"}},
		{"every invalid field is named", []string{"-control-plane-url", "ftp://x", "-os-family", "beos"}, nil, "",
			[]string{"NODE_AGENT_CONTROL_PLANE_URL", "NODE_AGENT_OS_FAMILY"}},
		{"unknown flag", append([]string{"-frobnicate"}, url...), nil, "", []string{"flags:", "frobnicate"}},
		{"positional argument", append(append([]string{}, url...), "extra"), nil, "", []string{`unexpected argument "extra"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"-config", writeConfigFile(t, tc.file)}, args...)
			}
			_, err := loadConfig(args, env(tc.env))
			if err == nil {
				t.Fatal("LoadConfig accepted an invalid configuration")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadConfigTerminalURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"defaults to the control plane URL", []string{"-control-plane-url", "https://cp.example:8443"}, nil,
			"https://cp.example:8443"},
		{"defaults to the final control plane URL", []string{"-control-plane-url", "https://flag.example:8443"},
			map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://env.example:8443"}, "https://flag.example:8443"},
		{"env", nil, map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://cp.example:8443",
			"NODE_AGENT_TERMINAL_URL": "https://term.example:9443"}, "https://term.example:9443"},
		{"flag over env", []string{"-terminal-url", "https://flag-term.example:9443"},
			map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://cp.example:8443",
				"NODE_AGENT_TERMINAL_URL": "https://term.example:9443"}, "https://flag-term.example:9443"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, env(tc.env))
			if err != nil {
				t.Fatalf("LoadConfig: %v", err)
			}
			if c.TerminalURL != tc.want {
				t.Errorf("TerminalURL = %q, want %q", c.TerminalURL, tc.want)
			}
		})
	}
}

// TestNewValidates checks that agent.New refuses an invalid Config before
// touching the state directory.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	_, err := agent.New(agent.Config{ControlPlaneURL: "http://cp:8443", OSFamily: "linux", StateDir: dir})
	if err == nil || !strings.Contains(err.Error(), "NODE_AGENT_CONTROL_PLANE_URL") {
		t.Fatalf("New = %v, want an error naming NODE_AGENT_CONTROL_PLANE_URL", err)
	}
	if _, statErr := os.Stat(dir); !os.IsNotExist(statErr) {
		t.Errorf("New created the state dir despite an invalid config (stat: %v)", statErr)
	}
}

func TestLoadConfigReservedCapacity(t *testing.T) {
	env := map[string]string{
		"NODE_AGENT_CONTROL_PLANE_URL":   "https://cp:8443",
		"NODE_AGENT_RESERVED_VCPUS":      "2",
		"NODE_AGENT_RESERVED_MEMORY_MIB": "4096",
	}
	c, err := loadConfig(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.ReservedVCPUs != 2 || c.ReservedMemoryMiB != 4096 {
		t.Fatalf("reserved = %d vCPU, %d MiB; want 2, 4096", c.ReservedVCPUs, c.ReservedMemoryMiB)
	}
	c, err = loadConfig([]string{"-reserved-vcpus", "1"}, func(k string) string { return env[k] })
	if err != nil || c.ReservedVCPUs != 1 {
		t.Fatalf("flag should win: %d, %v", c.ReservedVCPUs, err)
	}
	env["NODE_AGENT_RESERVED_VCPUS"] = "-1"
	if _, err := loadConfig(nil, func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "NODE_AGENT_RESERVED_VCPUS") {
		t.Fatalf("negative reserve: err = %v, want it to name NODE_AGENT_RESERVED_VCPUS", err)
	}
}

// TestHelp: -h, -help and --help print every flag with its environment
// variable and default instead of running (or failing on missing settings).
func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		_, err := loadConfig([]string{arg}, env(nil))
		var help *agent.HelpError
		if !errors.As(err, &help) {
			t.Fatalf("%s: err = %v, want *HelpError", arg, err)
		}
		for _, want := range []string{
			"-control-plane-url", "NODE_AGENT_CONTROL_PLANE_URL",
			"-node-id", "NODE_AGENT_HOST_ID",
			"-reserved-memory-mib", "NODE_AGENT_RESERVED_MEMORY_MIB",
			"-image-allow-local-urls", "NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS",
			"-config", "NODE_AGENT_CONFIG",
			"(default /var/lib/drover/images)", "(default qemu)",
		} {
			if !strings.Contains(help.Usage, want) {
				t.Errorf("%s: usage lacks %q:\n%s", arg, want, help.Usage)
			}
		}
		for _, line := range strings.Split(help.Usage, "\n") {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "-") && f[1] == "-" {
				t.Errorf("flag %s has no environment variable LoadConfig reads", f[0])
			}
		}
	}
}

// TestLoadConfigRuntimes: NODE_AGENT_RUNTIME may name a runtime of the
// registry LoadConfig is given, or none; the error and -help list them.
func TestLoadConfigRuntimes(t *testing.T) {
	t.Parallel()
	url := []string{"-control-plane-url", "https://cp.example:8443"}
	qemuOnly := noderuntime.Registry{qemu.Name: qemu.Entry()} // drover-agent's
	cases := []struct {
		name     string
		runtimes noderuntime.Registry
		args     []string
		want     string // substring of the error; "" for success
	}{
		{"default qemu, registered", qemuOnly, nil, ""},
		{"mock not linked into drover-agent", qemuOnly, []string{"-runtime", "mock"},
			`NODE_AGENT_RUNTIME "mock": must be one of qemu, none`},
		{"mock registered", testRuntimes, []string{"-runtime", "mock"}, ""},
		{"none is built in", nil, []string{"-runtime", "none"}, ""},
		{"default qemu, nothing registered", nil, nil, `NODE_AGENT_RUNTIME "qemu": must be one of none`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := agent.LoadConfig(append(append([]string{}, url...), tc.args...), env(nil), tc.runtimes, agent.WithDefaultEnvFile(""))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("LoadConfig: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("LoadConfig = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	_, err := agent.LoadConfig([]string{"-help"}, env(nil), qemuOnly, agent.WithDefaultEnvFile(""))
	var help *agent.HelpError
	if !errors.As(err, &help) || !strings.Contains(help.Usage, "instance runtime: qemu | none (default qemu)") {
		t.Errorf("usage does not list the registered runtimes: %v", err)
		if help != nil {
			t.Log(help.Usage)
		}
	}
}

// TestLoadConfigRuntimeSettings: a runtime's own keys (qemu's
// NODE_AGENT_QEMU_BINARY) come from the config file, the environment and
// their flag in that order of precedence, -help lists them beside their
// key, and a binary that does not register the runtime does not know them.
func TestLoadConfigRuntimeSettings(t *testing.T) {
	t.Parallel()
	const key = "NODE_AGENT_QEMU_BINARY"
	url := []string{"-control-plane-url", "https://cp.example:8443"}
	file := writeConfigFile(t, key+"=/file/qemu\n")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"file", []string{"-config", file}, nil, "/file/qemu"},
		{"env over file", []string{"-config", file}, map[string]string{key: "/env/qemu"}, "/env/qemu"},
		{"flag over env", []string{"-config", file, "-qemu-binary", "/flag/qemu"}, map[string]string{key: "/env/qemu"}, "/flag/qemu"},
	} {
		c, err := agent.LoadConfig(append(append([]string{}, url...), tc.args...), env(tc.env), testRuntimes, agent.WithDefaultEnvFile(""))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := c.RuntimeSettings[key]; got != tc.want {
			t.Errorf("%s: %s = %q, want %q", tc.name, key, got, tc.want)
		}
	}
	_, err := agent.LoadConfig([]string{"-help"}, env(nil), testRuntimes, agent.WithDefaultEnvFile(""))
	var help *agent.HelpError
	if !errors.As(err, &help) || !regexp.MustCompile(`-qemu-binary\s+`+key+`\s+QEMU system emulator`).MatchString(help.Usage) {
		t.Errorf("usage does not list -qemu-binary with its key: %v", err)
	}
	mockOnly := noderuntime.Registry{mock.Name: mock.Entry()}
	if _, err := agent.LoadConfig(append(append([]string{}, url...), "-runtime", "mock", "-qemu-binary", "/x"), env(nil), mockOnly, agent.WithDefaultEnvFile("")); err == nil {
		t.Error("-qemu-binary accepted without qemu registered")
	}
	if _, err := agent.LoadConfig(append(append([]string{}, url...), "-runtime", "mock", "-config", file), env(nil), mockOnly, agent.WithDefaultEnvFile("")); err == nil ||
		!strings.Contains(err.Error(), "unknown key") {
		t.Errorf("config file with %s and no qemu registered = %v, want unknown key", key, err)
	}
}
