package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/alecthomas/kong"
)

// unsetEnv removes the variables for the test (restored after it).
func unsetEnv(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		t.Setenv(k, "")
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
}

// serverEnv are the DROVER_* variables the tests below set or must not see.
var serverEnv = []string{"DROVER_CONFIG", "DROVER_LISTEN", "DROVER_NODE_LISTEN", "DROVER_NODE_URL", "DROVER_TLS_SAN",
	"DROVER_STORE", "DROVER_VCPU_ALLOCATION_RATIO", "DROVER_TERMINAL_ALLOWED_ORIGINS", "DROVER_RECORDING_DIR",
	"DROVER_KEK_FILE", "DROVER_PREVIOUS_KEK_FILES", "ALLOW_UNKNOWN_HOST_REGISTRATION", "DROVER_REGISTER_RATE",
	"DROVER_REGISTER_BURST"}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// parse parses args as the drover command line does and returns the root.
func parse(t *testing.T, args ...string) (*CLI, error) {
	t.Helper()
	var root CLI
	p, err := kong.New(&root, kong.Name("drover"), devRuntimeVars())
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Parse(args)
	return &root, err
}

// TestServerConfigFilePrecedence: a --config value applies where neither
// the flag nor its DROVER_* variable is given; TOML, YAML and JSON files
// with the same keys give the same result; dashed keys are accepted.
func TestServerConfigFilePrecedence(t *testing.T) {
	unsetEnv(t, serverEnv...)
	files := map[string]string{
		"s.toml": "listen = \"127.0.0.1:1001\"\nnode_listen = \":1002\"\nstore = \"sqlite:/file.db\"\n" +
			"heartbeat_interval = \"7s\"\ntls_san = [\"a.example\", \"b.example\"]\nvcpu_allocation_ratio = 2.5\nrecord_input = true\nhttp_max_header_bytes = 1024\n",
		"s.yaml": "listen: 127.0.0.1:1001\nnode-listen: \":1002\"\nstore: sqlite:/file.db\n" +
			"heartbeat_interval: 7s\ntls_san: [a.example, b.example]\nvcpu_allocation_ratio: 2.5\nrecord_input: true\nhttp_max_header_bytes: 1024\n",
		"s.json": `{"listen": "127.0.0.1:1001", "node_listen": ":1002", "store": "sqlite:/file.db",
 "heartbeat_interval": "7s", "tls_san": ["a.example", "b.example"], "vcpu_allocation_ratio": 2.5, "record_input": true, "http_max_header_bytes": 1024}`,
	}
	for name, content := range files {
		path := writeFile(t, name, content)
		cases := []struct {
			name       string
			args       []string
			env        map[string]string
			listen     string
			nodeListen string
			store      string
		}{
			{"file over defaults", nil, nil, "127.0.0.1:1001", ":1002", "sqlite:/file.db"},
			{"env over file", nil, map[string]string{"DROVER_LISTEN": "127.0.0.1:2001", "DROVER_STORE": "sqlite:/env.db"},
				"127.0.0.1:2001", ":1002", "sqlite:/env.db"},
			{"flag over env over file", []string{"--listen", "127.0.0.1:3001"}, map[string]string{"DROVER_LISTEN": "127.0.0.1:2001"},
				"127.0.0.1:3001", ":1002", "sqlite:/file.db"},
			{"DROVER_CONFIG names the file", nil, map[string]string{"DROVER_CONFIG": path}, "127.0.0.1:1001", ":1002", "sqlite:/file.db"},
		}
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				args := append([]string{"server"}, tc.args...)
				if tc.env["DROVER_CONFIG"] == "" {
					args = append(args, "--config", path)
				}
				root, err := parse(t, args...)
				if err != nil {
					t.Fatal(err)
				}
				s := root.Server
				if s.Listen != tc.listen || s.NodeListen != tc.nodeListen || s.Store != tc.store {
					t.Errorf("listen %q node-listen %q store %q, want %q %q %q", s.Listen, s.NodeListen, s.Store, tc.listen, tc.nodeListen, tc.store)
				}
				if s.HeartbeatInterval != 7*time.Second || !slices.Equal(s.TLSSAN, []string{"a.example", "b.example"}) ||
					s.VCPURatio != 2.5 || !s.RecordInput || s.HTTPMaxHeaderBytes != 1024 {
					t.Errorf("typed values: %+v", s.ServerFlags)
				}
				if s.CertTTL != 24*time.Hour {
					t.Errorf("cert-ttl %s, want its default 24h", s.CertTTL)
				}
			})
		}
	}
}

// TestRegisterLimitFlags: --register-rate and --register-burst reach the
// replica's config (the per-IP enrolment limit), from a flag, a DROVER_*
// variable or the config file; a value it cannot run with names the flag.
func TestRegisterLimitFlags(t *testing.T) {
	unsetEnv(t, serverEnv...)
	file := writeFile(t, "s.toml", "register_rate = 40\nregister_burst = 200\n")
	cases := []struct {
		name      string
		args      []string
		env       map[string]string
		wantRate  rate.Limit
		wantBurst int
		wantErr   string
	}{
		{name: "defaults", wantRate: 5, wantBurst: 10},
		{name: "flags", args: []string{"--register-rate", "50.5", "--register-burst", "500"}, wantRate: 50.5, wantBurst: 500},
		{name: "env", env: map[string]string{"DROVER_REGISTER_RATE": "100", "DROVER_REGISTER_BURST": "1000"}, wantRate: 100, wantBurst: 1000},
		{name: "config file", args: []string{"--config", file}, wantRate: 40, wantBurst: 200},
		{name: "zero rate", args: []string{"--register-rate", "0"}, wantErr: "--register-rate 0: must be a positive number"},
		{name: "negative rate", args: []string{"--register-rate=-1"}, wantErr: "--register-rate -1"},
		{name: "infinite rate", args: []string{"--register-rate", "+Inf"}, wantErr: "--register-rate +Inf"},
		{name: "zero burst", args: []string{"--register-burst", "0"}, wantErr: "--register-burst 0: must be at least 1"},
	}
	for _, tc := range cases {
		for _, cmd := range []string{"server", "dev"} {
			t.Run(tc.name+"/"+cmd, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				args := append([]string{cmd}, tc.args...)
				if cmd == "server" {
					args = append(args, "--store", "sqlite:/x.db")
				}
				root, err := parse(t, args...)
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				f := root.Server.ServerFlags
				if cmd == "dev" {
					f = root.Dev.ServerFlags
				}
				cfg := f.config(false, nil)
				if cfg.RegisterRate != tc.wantRate || cfg.RegisterBurst != tc.wantBurst {
					t.Errorf("rate %v burst %d, want %v %d", cfg.RegisterRate, cfg.RegisterBurst, tc.wantRate, tc.wantBurst)
				}
			})
		}
	}
}

// TestServerConfigFileErrors: every problem names the file, its line and
// the key.
func TestServerConfigFileErrors(t *testing.T) {
	unsetEnv(t, serverEnv...)
	cases := []struct {
		name, file, content string
		cmd                 string
		want                []string
	}{
		{"toml unknown key", "s.toml", "listen = \"x:1\"\n\nlisten_addr = \"y\"\n", "server", []string{":3:", `unknown key "listen_addr"`, "node_listen"}},
		{"yaml unknown key", "s.yaml", "listen: x:1\nbogus: 2\n", "server", []string{":2:", `unknown key "bogus"`}},
		{"json unknown key", "s.json", "{\n  \"listen\": \"x:1\",\n  \"bogus\": 2\n}\n", "server", []string{":3:", `unknown key "bogus"`}},
		{"toml bad duration", "s.toml", "store = \"sqlite:/x\"\ncert_ttl = \"a day\"\n", "server", []string{":2:", "cert_ttl", "duration"}},
		{"yaml bad integer", "s.yaml", "store: sqlite:/x\nhttp_max_header_bytes: lots\n", "server", []string{":2:", "http_max_header_bytes"}},
		{"json bad boolean", "s.json", "{\"store\": \"sqlite:/x\",\n\"record_input\": \"maybe\"}", "server", []string{":2:", "record_input"}},
		{"table value", "s.toml", "store = \"sqlite:/x\"\n[listen]\nhost = \"x\"\n", "server", []string{":2:", "listen", "want a plain value, got table"}},
		{"list for a plain flag", "s.yaml", "store: sqlite:/x\nlisten: [a, b]\n", "server", []string{":2:", "listen", "got list"}},
		{"same key twice", "s.yaml", "node_listen: a\nnode-listen: b\n", "server", []string{":2:", "node-listen", "set again", "line 1"}},
		{"toml syntax", "s.toml", "listen = \"x:1\"\nstore = \n", "server", []string{":2:", "toml"}},
		{"json syntax", "s.json", "{\n\"listen\": \"x:1\",,\n}", "server", []string{":2:", "json"}},
		{"yaml syntax", "s.yaml", "listen: x\nstore: [a, b\n", "server", []string{"yaml: line "}},
		{"dev enum", "d.toml", "runtime = \"xen\"\n", "dev", []string{":1:", "runtime", `"xen" must be one of`}},
		{"dev has no store", "d.toml", "store = \"sqlite:/x\"\n", "dev", []string{":1:", `unknown key "store"`}},
		{"not a config extension", "s.conf", "listen=x\n", "server", []string{"s.conf", "not a .toml, .yaml, .yml or .json file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.file, tc.content)
			_, err := parse(t, tc.cmd, "--config", path)
			if err == nil {
				t.Fatal("parse accepted a bad config file")
			}
			for _, w := range append([]string{path}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "nope.toml")
		if _, err := parse(t, "server", "--config", path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("error = %v, want one naming %s", err, path)
		}
	})
	t.Run("run prints it and exits 2", func(t *testing.T) {
		path := writeFile(t, "s.toml", "bogus = 1\n")
		var out, errb bytes.Buffer
		code := Run(context.Background(), []string{"server", "--config", path}, &Env{Stdout: &out, Stderr: &errb})
		if code != 2 || !strings.Contains(errb.String(), path+":1: unknown key") {
			t.Errorf("code %d, stderr %q", code, errb.String())
		}
	})
}

// TestShippedServerConfig: config/drover.example.toml parses for drover
// server (and every key there is a flag of drover dev too, but store).
func TestShippedServerConfig(t *testing.T) {
	unsetEnv(t, serverEnv...)
	path := filepath.Join("..", "..", "config", "drover.example.toml")
	root, err := parse(t, "server", "--config", path, "--store", "sqlite:/x.db")
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if root.Server.NodeURL == "" || root.Server.NodeListen != ":8443" {
		t.Errorf("example not applied: %+v", root.Server.ServerFlags)
	}
}
