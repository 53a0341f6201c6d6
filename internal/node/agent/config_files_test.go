package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/drover-dev/drover/internal/node/agent"
)

// writeNamed writes content to a fresh file called name.
func writeNamed(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// show runs `drover-agent config show --json` and returns its settings
// by key, its output and exit code.
func show(t *testing.T, args []string, getenv func(string) string, opts ...agent.LoadOption) (agent.ShownConfig, map[string]agent.ShownSetting, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := agent.ConfigCommand(append([]string{"show", "--json"}, args...), getenv, testRuntimes, &out, &errb, opts...)
	var sc agent.ShownConfig
	if code != 2 {
		if err := json.Unmarshal(out.Bytes(), &sc); err != nil {
			t.Fatalf("config show --json: %v\n%s", err, out.String())
		}
	}
	by := map[string]agent.ShownSetting{}
	for _, s := range sc.Settings {
		by[s.Key] = s
	}
	return sc, by, errb.String(), code
}

// TestConfigLayers: flags > environment > config file > env file >
// defaults, for every format of config file, with each value's source.
func TestConfigLayers(t *testing.T) {
	t.Parallel()
	envFile := writeNamed(t, "env", "# agent env\nNODE_AGENT_CONTROL_PLANE_URL=https://envfile.example:8443\n"+
		"NODE_AGENT_HOST_ID=host-envfile\nNODE_AGENT_STATE_DIR=/envfile/state\nNODE_AGENT_LISTEN=127.0.0.1:9101\n"+
		"HTTPS_PROXY=http://proxy:3128\n")
	configs := map[string]string{
		"agent.toml": "control_plane_url = \"https://file.example:8443\"\nhost_id = \"host-file\"\nheartbeat_interval = \"1s\"\n",
		"agent.yaml": "control_plane_url: https://file.example:8443\nhost_id: host-file\nheartbeat_interval: 1s\n",
		"agent.yml":  "control_plane_url: https://file.example:8443\nhost_id: host-file\nheartbeat_interval: 1s\n",
		"agent.json": "{\"control_plane_url\": \"https://file.example:8443\",\n\"host_id\": \"host-file\",\n\"heartbeat_interval\": \"1s\"}\n",
		"agent.env":  "NODE_AGENT_CONTROL_PLANE_URL=https://file.example:8443\nNODE_AGENT_HOST_ID=host-file\nNODE_AGENT_HEARTBEAT_INTERVAL=1s\n",
	}
	for name, content := range configs {
		cfg := writeNamed(t, name, content)
		type want struct{ url, urlSrc, host, hostSrc, state, stateSrc, listen, listenSrc, hb, hbSrc string }
		cases := []struct {
			name string
			args []string
			env  map[string]string
			want want
		}{
			{"env file over defaults", []string{"-env-file", envFile}, nil, want{
				"https://envfile.example:8443", "env-file " + envFile + ":2", "host-envfile", "env-file " + envFile + ":3",
				"/envfile/state", "env-file " + envFile + ":4", "127.0.0.1:9101", "env-file " + envFile + ":5", "", "default"}},
			{"config file over env file", []string{"-env-file", envFile, "-config", cfg}, nil, want{
				"https://file.example:8443", "config " + cfg + ":1", "host-file", "config " + cfg + ":2",
				"/envfile/state", "env-file " + envFile + ":4", "127.0.0.1:9101", "env-file " + envFile + ":5", "1s", "config " + cfg + ":3"}},
			{"environment over config file", []string{"-env-file", envFile, "-config", cfg},
				map[string]string{"NODE_AGENT_HOST_ID": "host-env", "NODE_AGENT_LISTEN": "127.0.0.1:9102"}, want{
					"https://file.example:8443", "config " + cfg + ":1", "host-env", "env NODE_AGENT_HOST_ID",
					"/envfile/state", "env-file " + envFile + ":4", "127.0.0.1:9102", "env NODE_AGENT_LISTEN", "1s", "config " + cfg + ":3"}},
			{"flags over environment", []string{"-config", cfg, "-node-id", "host-flag", "-heartbeat-interval", "3s"},
				map[string]string{"NODE_AGENT_HOST_ID": "host-env", "NODE_AGENT_ENV_FILE": envFile}, want{
					"https://file.example:8443", "config " + cfg + ":1", "host-flag", "flag -node-id",
					"/envfile/state", "env-file " + envFile + ":4", "127.0.0.1:9101", "env-file " + envFile + ":5", "3s", "flag -heartbeat-interval"}},
			{"NODE_AGENT_CONFIG and the default env file", nil, map[string]string{"NODE_AGENT_CONFIG": cfg}, want{
				"https://file.example:8443", "config " + cfg + ":1", "host-file", "config " + cfg + ":2",
				"/envfile/state", "env-file " + envFile + ":4", "127.0.0.1:9101", "env-file " + envFile + ":5", "1s", "config " + cfg + ":3"}},
		}
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				_, by, stderr, code := show(t, tc.args, env(tc.env), agent.WithDefaultEnvFile(envFile))
				if code != 0 {
					t.Fatalf("config show exit %d: %s", code, stderr)
				}
				got := want{by["control_plane_url"].Value, by["control_plane_url"].Source, by["host_id"].Value, by["host_id"].Source,
					by["state_dir"].Value, by["state_dir"].Source, by["listen"].Value, by["listen"].Source,
					by["heartbeat_interval"].Value, by["heartbeat_interval"].Source}
				if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				// LoadConfig agrees with config show.
				c, err := agent.LoadConfig(tc.args, env(tc.env), testRuntimes, agent.WithDefaultEnvFile(envFile))
				if err != nil || c.HostID != tc.want.host || c.StateDir != tc.want.state {
					t.Errorf("LoadConfig = %v, host %q state %q", err, c.HostID, c.StateDir)
				}
			})
		}
	}
}

// TestConfigFileFormats: TOML, YAML and JSON files with the same keys give
// the same configuration as the env-style file and the environment.
func TestConfigFileFormats(t *testing.T) {
	t.Parallel()
	files := map[string]string{
		"a.toml": `control_plane_url = "https://cp.example:8443"
host_id = "gpu-01"
bootstrap_token = "tok"
state_dir = "/srv/state"
heartbeat_interval = "250ms"
reserved_vcpus = 2
reserved_memory_mib = 4096
disk_pressure_percent = 80
runtime = "mock"
image_dirs = ["/srv/images", "/var/lib/libvirt/images"]
image_allow_local_urls = true
qemu_binary = "/opt/qemu"
reconcile_interval = "2s"
`,
		"a.yaml": `control_plane_url: https://cp.example:8443
host_id: gpu-01
bootstrap_token: tok
state_dir: /srv/state
heartbeat_interval: 250ms
reserved_vcpus: 2
reserved_memory_mib: 4096
disk_pressure_percent: 80
runtime: mock
image_dirs: /srv/images,/var/lib/libvirt/images
image_allow_local_urls: true
qemu_binary: /opt/qemu
reconcile_interval: 2s
`,
		"a.json": `{"control_plane_url": "https://cp.example:8443", "host_id": "gpu-01", "bootstrap_token": "tok",
"state_dir": "/srv/state", "heartbeat_interval": "250ms", "reserved_vcpus": 2, "reserved_memory_mib": 4096,
"disk_pressure_percent": 80, "runtime": "mock", "image_dirs": ["/srv/images", "/var/lib/libvirt/images"],
"image_allow_local_urls": true, "qemu_binary": "/opt/qemu", "reconcile_interval": "2s"}`,
	}
	vars := map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://cp.example:8443", "NODE_AGENT_HOST_ID": "gpu-01",
		"NODE_AGENT_BOOTSTRAP_TOKEN": "tok", "NODE_AGENT_STATE_DIR": "/srv/state", "NODE_AGENT_HEARTBEAT_INTERVAL": "250ms",
		"NODE_AGENT_RESERVED_VCPUS": "2", "NODE_AGENT_RESERVED_MEMORY_MIB": "4096", "NODE_AGENT_DISK_PRESSURE_PERCENT": "80",
		"NODE_AGENT_RUNTIME": "mock", "NODE_AGENT_IMAGE_DIRS": "/srv/images,/var/lib/libvirt/images",
		"NODE_AGENT_IMAGE_ALLOW_LOCAL_URLS": "true", "NODE_AGENT_QEMU_BINARY": "/opt/qemu", "NODE_AGENT_RECONCILE_INTERVAL": "2s"}
	want, err := loadConfig(nil, env(vars))
	if err != nil {
		t.Fatal(err)
	}
	if want.ReservedVCPUs != 2 || want.HeartbeatInterval != 250*time.Millisecond || !want.ImageAllowLocalURLs {
		t.Fatalf("environment not applied: %+v", want)
	}
	var lines []string
	for k, v := range vars {
		lines = append(lines, k+"="+v)
	}
	files["a.conf"] = strings.Join(lines, "\n")
	for name, content := range files {
		c, err := loadConfig([]string{"-config", writeNamed(t, name, content)}, env(nil))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(want, c, cmpopts.IgnoreFields(agent.Config{}, "Runtimes")); diff != "" {
			t.Errorf("%s (-environment +file):\n%s", name, diff)
		}
	}
}

// TestConfigFileErrors: every problem in a config or env file names the
// file, the line and the key.
func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, file, content string
		want                []string
	}{
		{"toml unknown key", "a.toml", "host_id = \"h1\"\n\nhost_idd = \"h2\"\n", []string{":3:", `unknown key "host_idd"`}},
		{"toml env-style key", "a.toml", "NODE_AGENT_HOST_ID = \"h1\"\n", []string{":1:", `unknown key "NODE_AGENT_HOST_ID"`, "did you mean host_id?"}},
		{"toml table", "a.toml", "host_id = \"h1\"\n[qemu]\nbinary = \"/x\"\n", []string{":2:", `unknown key "qemu"`}},
		{"toml wrong type", "a.toml", "reserved_vcpus = \"two\"\n", []string{":1:", "reserved_vcpus", `want a whole number, got string "two"`}},
		{"toml bad duration", "a.toml", "host_id = \"h\"\nheartbeat_interval = \"soon\"\n", []string{":2:", "heartbeat_interval", "NODE_AGENT_HEARTBEAT_INTERVAL"}},
		{"toml duration as number", "a.toml", "reconcile_interval = 5\n", []string{":1:", "reconcile_interval", `want a duration string such as "5s", got integer "5"`}},
		{"toml string as number", "a.toml", "host_id = 7\n", []string{":1:", "host_id", `want a string, got integer "7"`}},
		{"toml syntax", "a.toml", "host_id = \"h\"\nstate_dir = \n", []string{":2:", "toml"}},
		{"toml key twice", "a.toml", "host_id = \"a\"\nhost_id = \"b\"\n", []string{"toml"}},
		{"yaml unknown key", "a.yaml", "host_id: h\nbogus: 1\n", []string{":2:", `unknown key "bogus"`}},
		{"yaml wrong type", "a.yml", "host_id: h\nimage_allow_local_urls: maybe\n", []string{":2:", "image_allow_local_urls", `want true or false, got string "maybe"`}},
		{"yaml bad percent", "a.yaml", "disk_pressure_percent: 150\n", []string{":1:", "disk_pressure_percent", "between 1 and 100"}},
		{"yaml negative", "a.yaml", "\nreserved_memory_mib: -5\n", []string{":2:", "reserved_memory_mib", ">= 0"}},
		{"yaml list of numbers", "a.yaml", "image_dirs: [1, 2]\n", []string{":1:", "image_dirs", "list of strings"}},
		{"yaml null", "a.yaml", "host_id:\n", []string{":1:", "host_id", "got null"}},
		{"yaml key twice", "a.yaml", "host_id: a\nstate_dir: /s\nhost_id: b\n", []string{":3:", "host_id", "set again (first on line 1)"}},
		{"yaml not a mapping", "a.yaml", "- a\n- b\n", []string{":1:", "mapping"}},
		{"yaml syntax", "a.yaml", "host_id: [a\n", []string{"yaml: line"}},
		{"json unknown key", "a.json", "{\n  \"host_id\": \"h\",\n  \"bogus\": true\n}\n", []string{":3:", `unknown key "bogus"`}},
		{"json wrong type", "a.json", "{\"host_id\": \"h\",\n\n \"reserved_vcpus\": 1.5}", []string{":3:", "reserved_vcpus", "want a whole number, got number"}},
		{"json syntax", "a.json", "{\n\"host_id\": \"h\"\n\"state_dir\": \"/s\"}", []string{":3:", "json"}},
		{"json key twice", "a.json", "{\"host_id\": \"a\",\n\"host_id\": \"b\"}", []string{":2:", "set again"}},
		{"json not an object", "a.json", "[1]", []string{":1:", "object"}},
		{"json trailing data", "a.json", "{}\n{}", []string{":2:", "after the top-level object"}},
		{"json truncated", "a.json", "{\"host_id\": ", []string{"json"}},
		{"env-style unknown key", "a.env", "# c\nNODE_AGENT_HOST_ID=h1\nNODE_AGENT_BOGUS=1\n", []string{":3:", `unknown key "NODE_AGENT_BOGUS"`}},
		{"env-style malformed line", "a.env", "NODE_AGENT_HOST_ID=h1\njust some words\n", []string{":2:", "want KEY=VALUE"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeNamed(t, tc.file, tc.content)
			_, err := loadConfig([]string{"-config", path, "-control-plane-url", "https://cp:8443"}, env(nil))
			if err == nil {
				t.Fatal("LoadConfig accepted a bad config file")
			}
			for _, w := range append([]string{"config file", path}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestEnvFile: the default env file may be absent; a named one may not;
// malformed lines and unknown NODE_AGENT_* keys name file and line; other
// variables are left to the process environment.
func TestEnvFile(t *testing.T) {
	t.Parallel()
	url := []string{"-control-plane-url", "https://cp:8443"}
	missing := filepath.Join(t.TempDir(), "absent", "env")
	good := writeNamed(t, "env", "export NODE_AGENT_HOST_ID='h-1'\nPATH=/bin\nHTTPS_PROXY=http://p:3128\n")
	cases := []struct {
		name    string
		args    []string
		vars    map[string]string
		def     string
		want    []string // error substrings; nil for success
		wantErr bool
	}{
		{"absent default is fine", url, nil, missing, nil, false},
		{"default read", url, nil, good, nil, false},
		{"absent -env-file", append([]string{"-env-file", missing}, url...), nil, "", []string{"env file", missing, "no such file"}, true},
		{"absent NODE_AGENT_ENV_FILE", url, map[string]string{"NODE_AGENT_ENV_FILE": missing}, "", []string{"env file", missing}, true},
		{"-env-file \"\" reads none", append([]string{"-env-file", ""}, url...), nil, writeNamed(t, "bad", "nonsense\n"), nil, false},
		{"malformed line", url, nil, writeNamed(t, "env", "# ok\nNODE_AGENT_HOST_ID=h\nnot a line\n"), []string{"env file", ":3:", "want KEY=VALUE"}, true},
		{"key with spaces", url, nil, writeNamed(t, "env", "NODE AGENT=1\n"), []string{"env file", ":1:", "want KEY=VALUE"}, true},
		{"unknown NODE_AGENT_ key", url, nil, writeNamed(t, "env", "NODE_AGENT_HOST_ID=h\nNODE_AGENT_HOSTID=h\n"), []string{"env file", ":2:", `unknown key "NODE_AGENT_HOSTID"`}, true},
		{"bad value", url, nil, writeNamed(t, "env", "NODE_AGENT_RESERVED_VCPUS=many\n"), []string{"env file", ":1:", "NODE_AGENT_RESERVED_VCPUS"}, true},
		{"no file names in it", url, nil, writeNamed(t, "env", "NODE_AGENT_CONFIG=/x.toml\n"), []string{"env file", ":1:", "NODE_AGENT_CONFIG names a file"}, true},
		{"a directory", url, nil, t.TempDir(), []string{"env file"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := agent.LoadConfig(tc.args, env(tc.vars), testRuntimes, agent.WithDefaultEnvFile(tc.def))
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("LoadConfig: %v", err)
				}
				if tc.def == good && c.HostID != "h-1" {
					t.Errorf("HostID = %q, want h-1 from the env file", c.HostID)
				}
				return
			}
			if err == nil {
				t.Fatal("LoadConfig accepted a bad env file")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("unreadable", func(t *testing.T) {
		want := "permission denied"
		p := writeNamed(t, "env", "NODE_AGENT_HOST_ID=h\n")
		switch {
		case os.Geteuid() == 0 && runtime.GOOS == "linux":
			// Root reads a mode 000 file; no one reads /proc/self/mem
			// from offset 0 (EIO), root included.
			p, want = "/proc/self/mem", "input/output error"
		case runtime.GOOS == "windows":
			return // no mode bits; the directory case covers an unreadable path
		default:
			if err := os.Chmod(p, 0); err != nil {
				t.Fatal(err)
			}
		}
		_, err := agent.LoadConfig(url, env(nil), testRuntimes, agent.WithDefaultEnvFile(p))
		if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v, want %s naming %s", err, want, p)
		}
	})
}

func TestDefaultEnvFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		goos, programData, want string
	}{
		{"linux", "", "/etc/drover-agent/env"},
		{"dragonfly", "", "/etc/drover-agent/env"},
		{"windows", `D:\Data`, `D:\Data\drover-agent\env`},
		{"windows", "", `C:\ProgramData\drover-agent\env`},
	} {
		if got := agent.DefaultEnvFile(tc.goos, env(map[string]string{"ProgramData": tc.programData})); got != tc.want {
			t.Errorf("DefaultEnvFile(%s, ProgramData=%q) = %q, want %q", tc.goos, tc.programData, got, tc.want)
		}
	}
}

// TestOrchestratorFlag: seed 003's -orchestrator host:port is an alias of
// -control-plane-url on every platform.
func TestOrchestratorFlag(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		vars map[string]string
		want string
		err  string
	}{
		{"host:port", []string{"-orchestrator", "cp.example.com:8443"}, nil, "https://cp.example.com:8443", ""},
		{"URL as is", []string{"-orchestrator", "https://cp.example.com:9443"}, nil, "https://cp.example.com:9443", ""},
		{"over the environment", []string{"-orchestrator", "cp:1"}, map[string]string{"NODE_AGENT_CONTROL_PLANE_URL": "https://env:2"}, "https://cp:1", ""},
		{"not with -control-plane-url", []string{"-orchestrator", "cp:1", "-control-plane-url", "https://cp:2"}, nil, "", "give one of them"},
		{"an http URL is refused", []string{"-orchestrator", "http://cp:1"}, nil, "", "NODE_AGENT_CONTROL_PLANE_URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(tc.args, env(tc.vars))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("LoadConfig = %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.ControlPlaneURL != tc.want || c.TerminalURL != tc.want {
				t.Errorf("control plane %q terminal %q, want %q", c.ControlPlaneURL, c.TerminalURL, tc.want)
			}
		})
	}
	_, by, _, _ := show(t, []string{"-orchestrator", "cp:1"}, env(nil), agent.WithDefaultEnvFile(""))
	if s := by["control_plane_url"]; s.Source != "flag -orchestrator" {
		t.Errorf("source %q, want flag -orchestrator", s.Source)
	}
}

// TestValidationNamesTheSource: a value that loads but does not validate
// is reported with where it was set.
func TestValidationNamesTheSource(t *testing.T) {
	t.Parallel()
	path := writeNamed(t, "a.toml", "host_id = \"h\"\n\ncontrol_plane_url = \"http://cp:8443\"\nos_family = \"plan9\"\n")
	_, err := loadConfig([]string{"-config", path}, env(map[string]string{"NODE_AGENT_RUNTIME": "xen"}))
	for _, w := range []string{
		fmt.Sprintf(`NODE_AGENT_CONTROL_PLANE_URL "http://cp:8443": must be an https:// URL of the node-facing listener (set by config %s:3)`, path),
		fmt.Sprintf("(set by config %s:4)", path),
		"(set by env NODE_AGENT_RUNTIME)",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v does not contain %q", err, w)
		}
	}
}

// TestConfigShow: the table lists every key with its value and source,
// secrets redacted; --help prints the usage only; an invalid configuration
// is shown and exits 1, an unreadable one exits 2.
func TestConfigShow(t *testing.T) {
	t.Parallel()
	envFile := writeNamed(t, "env", "NODE_AGENT_BOOTSTRAP_TOKEN=s3cret-token\n")
	cfg := writeNamed(t, "a.yaml", "control_plane_url: https://user:hunter2@cp.example:8443\nca_hash: sha256:abcd\n")
	var out, errb bytes.Buffer
	code := agent.ConfigCommand([]string{"show", "-env-file", envFile, "-config", cfg, "-listen", "127.0.0.1:9200"},
		env(map[string]string{"NODE_AGENT_HOST_ID": "gpu-01"}), testRuntimes, &out, &errb, agent.WithDefaultEnvFile(""))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	for _, w := range []string{
		"env file:    " + envFile, "config file: " + cfg,
		"KEY", "VALUE", "SOURCE",
		"bootstrap_token", "<redacted>", "env-file " + envFile + ":1",
		"https://user:redacted@cp.example:8443", "config " + cfg + ":1",
		"ca_hash", "sha256:abcd", "config " + cfg + ":2",
		"host_id", "gpu-01", "env NODE_AGENT_HOST_ID",
		"listen", "127.0.0.1:9200", "flag -listen",
		"state_dir", "default", "qemu_binary", "reserved_vcpus",
	} {
		if !strings.Contains(text, w) {
			t.Errorf("config show lacks %q:\n%s", w, text)
		}
	}
	for _, secret := range []string{"s3cret-token", "hunter2"} {
		if strings.Contains(text, secret) {
			t.Errorf("config show prints the secret %q:\n%s", secret, text)
		}
	}

	t.Run("help", func(t *testing.T) {
		for _, args := range [][]string{{"show", "--help"}, {"show", "-h"}, {"--help"}, {"show", "-config", "/nonexistent.toml", "-help"}} {
			var out, errb bytes.Buffer
			if code := agent.ConfigCommand(args, env(nil), testRuntimes, &out, &errb); code != 0 ||
				!strings.HasPrefix(out.String(), "Usage: drover-agent config show") || strings.Contains(out.String(), "SOURCE") {
				t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
			}
		}
	})
	t.Run("no subcommand", func(t *testing.T) {
		var out, errb bytes.Buffer
		if code := agent.ConfigCommand([]string{"list"}, env(nil), testRuntimes, &out, &errb); code != 2 || !strings.Contains(errb.String(), "Usage") {
			t.Errorf("exit %d, stderr %q", code, errb.String())
		}
	})
	t.Run("invalid configuration is shown, exit 1", func(t *testing.T) {
		sc, by, stderr, code := show(t, nil, env(nil), agent.WithDefaultEnvFile(""))
		if code != 1 || !strings.Contains(stderr, "NODE_AGENT_CONTROL_PLANE_URL (-control-plane-url) is required") ||
			!strings.Contains(sc.Invalid, "NODE_AGENT_CONTROL_PLANE_URL") || by["state_dir"].Source != "default" {
			t.Errorf("exit %d, stderr %q, shown %+v", code, stderr, sc)
		}
	})
	t.Run("unreadable configuration, exit 2", func(t *testing.T) {
		_, _, stderr, code := show(t, []string{"-config", writeNamed(t, "b.toml", "bogus = 1\n")}, env(nil), agent.WithDefaultEnvFile(""))
		if code != 2 || !strings.Contains(stderr, `unknown key "bogus"`) {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("absent default env file", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "env")
		sc, _, _, _ := show(t, []string{"-orchestrator", "cp:1"}, env(nil), agent.WithDefaultEnvFile(missing))
		if sc.EnvFile != missing || !sc.EnvFileAbsent {
			t.Errorf("env file %q absent %v", sc.EnvFile, sc.EnvFileAbsent)
		}
	})
}

// TestShippedAgentConfigs: the files in config/ load and validate, so
// that they cannot rot.
func TestShippedAgentConfigs(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"dev.toml", "agent.example.yaml"} {
		path := filepath.Join("..", "..", "..", "config", name)
		c, err := loadConfig([]string{"-config", path}, env(nil))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if c.ControlPlaneURL == "" || c.HostID == "" {
			t.Errorf("%s: control plane URL %q, host id %q", name, c.ControlPlaneURL, c.HostID)
		}
	}
}
