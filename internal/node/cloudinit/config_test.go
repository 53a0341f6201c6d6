package cloudinit

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
)

// testKey returns a fresh authorized_keys line with a comment.
func testKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " op@example"
}

// parseUserData strips the #cloud-config header and decodes the JSON body.
func parseUserData(t *testing.T, b []byte) map[string]any {
	t.Helper()
	body, ok := bytes.CutPrefix(b, []byte("#cloud-config\n"))
	if !ok {
		t.Fatalf("user-data does not start with #cloud-config: %q", b[:min(len(b), 40)])
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("user-data body is not JSON: %v\n%s", err, body)
	}
	return m
}

func TestUserData(t *testing.T) {
	key := testKey(t)
	c := Config{
		InstanceID:        "web_1",
		SSHAuthorizedKeys: []string{key + "\n"},
		Files: []File{
			{Path: "/run/drover/secrets/db", Content: []byte("s3cret\n"), Permissions: 0o400},
			{Path: "/etc/drover/env", Content: []byte{0, 1, 2}},
			{Path: "/usr/local/bin/x", Permissions: os.ModeSetgid | os.ModeSticky | 0o750},
		},
	}
	ud, err := c.UserData()
	if err != nil {
		t.Fatal(err)
	}
	got := parseUserData(t, ud)
	want := map[string]any{
		"hostname":          "web-1",
		"preserve_hostname": false,
		"ssh_pwauth":        false,
		"disable_root":      true,
		"users": []any{map[string]any{
			"name":                "drover",
			"sudo":                "ALL=(ALL) NOPASSWD:ALL",
			"shell":               "/bin/bash",
			"lock_passwd":         true,
			"ssh_authorized_keys": []any{key},
		}},
		"write_files": []any{
			map[string]any{"path": "/run/drover/secrets/db", "content": base64.StdEncoding.EncodeToString([]byte("s3cret\n")),
				"encoding": "b64", "owner": "root:root", "permissions": "0400"},
			map[string]any{"path": "/etc/drover/env", "content": "AAEC",
				"encoding": "b64", "owner": "root:root", "permissions": "0600"},
			map[string]any{"path": "/usr/local/bin/x", "content": "",
				"encoding": "b64", "owner": "root:root", "permissions": "03750"},
		},
		"runcmd": []any{[]any{"sh", "-c", readyScript, "drover-ready", "DROVER-READY web_1", "/var/lib/drover/ready"}},
	}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("user-data (-got +want):\n%s", diff)
	}
	if bytes.Contains(ud, []byte("s3cret")) {
		t.Error("secret content appears in clear in user-data")
	}

	var md map[string]string
	if err := json.Unmarshal(c.MetaData(), &md); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(md, map[string]string{"instance-id": "web_1", "local-hostname": "web-1"}); diff != "" {
		t.Errorf("meta-data (-got +want):\n%s", diff)
	}
}

func TestUserDataOverrides(t *testing.T) {
	c := Config{InstanceID: "i-1", Hostname: "gpu-7.example", User: "ops",
		ReadyMarker: "UP 'quoted' $HOME", ReadyFile: "/run/ready"}
	got := parseUserData(t, must(c.UserData()))
	if got["hostname"] != "gpu-7.example" {
		t.Errorf("hostname = %v", got["hostname"])
	}
	u := got["users"].([]any)[0].(map[string]any)
	if u["name"] != "ops" {
		t.Errorf("user = %v", u["name"])
	}
	if _, ok := u["ssh_authorized_keys"]; ok {
		t.Error("ssh_authorized_keys present without keys")
	}
	rc := got["runcmd"].([]any)[0].([]any)
	if rc[4] != "UP 'quoted' $HOME" || rc[5] != "/run/ready" {
		t.Errorf("runcmd args = %v", rc[3:])
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestValidate(t *testing.T) {
	key := testKey(t)
	ok := Config{InstanceID: "vm-1", SSHAuthorizedKeys: []string{key}}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string // substring; empty means valid
	}{
		{"ok", func(*Config) {}, ""},
		{"empty instance id", func(c *Config) { c.InstanceID = "" }, "cloudinit: instance_id: required"},
		{"instance id with space", func(c *Config) { c.InstanceID = "a b" }, "cloudinit: instance_id"},
		{"instance id underscore defaults hostname", func(c *Config) { c.InstanceID = "a_b" }, ""},
		{"instance id dot-only hostname", func(c *Config) { c.InstanceID = "..." }, "cloudinit: hostname (default from instance_id)"},
		{"bad hostname", func(c *Config) { c.Hostname = "-x" }, `cloudinit: hostname "-x"`},
		{"bad user upper", func(c *Config) { c.User = "Bob" }, `cloudinit: user "Bob"`},
		{"bad user root", func(c *Config) { c.User = "root" }, `cloudinit: user "root"`},
		{"bad user shell chars", func(c *Config) { c.User = "a;rm" }, `cloudinit: user`},
		{"bad key", func(c *Config) { c.SSHAuthorizedKeys = []string{key, "ssh-rsa AAAAnotakey"} }, "cloudinit: ssh_authorized_keys[1]:"},
		{"two keys in one entry", func(c *Config) { c.SSHAuthorizedKeys = []string{key + "\n" + key} }, "cloudinit: ssh_authorized_keys[0]: one key per entry"},
		{"marker newline", func(c *Config) { c.ReadyMarker = "a\nb" }, "cloudinit: ready_marker"},
		{"ready file relative", func(c *Config) { c.ReadyFile = "ready" }, "cloudinit: ready_file"},
		{"file path dotdot", func(c *Config) { c.Files = []File{{Path: "/run/../etc/shadow"}} }, "cloudinit: files[0].path"},
		{"file path dir", func(c *Config) { c.Files = []File{{Path: "/run/x/"}} }, "cloudinit: files[0].path"},
		{"file dup", func(c *Config) { c.Files = []File{{Path: "/a"}, {Path: "/a"}} }, "cloudinit: files[1].path \"/a\": already written by files[0]"},
		{"file setuid ok", func(c *Config) { c.Files = []File{{Path: "/a", Permissions: os.ModeSetuid | 0o755}} }, ""},
		{"file raw unix setuid", func(c *Config) { c.Files = []File{{Path: "/a", Permissions: 0o4755}} }, "cloudinit: files[0].permissions"},
		{"file mode type bits", func(c *Config) { c.Files = []File{{Path: "/a", Permissions: os.ModeDir | 0o755}} }, "cloudinit: files[0].permissions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
			if _, uerr := c.UserData(); uerr == nil {
				t.Error("UserData accepted an invalid config")
			}
		})
	}
}

func TestWriteSeedDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "seed")
	c := Config{InstanceID: "vm-1", SSHAuthorizedKeys: []string{testKey(t)}}
	if err := WriteSeedDir(dir, c); err != nil {
		t.Fatal(err)
	}
	if err := WriteSeedDir(dir, c); err != nil { // replacing is fine
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff(names, []string{"meta-data", "user-data"}); diff != "" {
		t.Errorf("seed dir entries (-got +want):\n%s", diff)
	}
	ud, err := os.ReadFile(filepath.Join(dir, "user-data"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ud, must(c.UserData())) {
		t.Error("user-data on disk differs from UserData()")
	}
	if runtime.GOOS != "windows" {
		for name, want := range map[string]os.FileMode{".": 0o700, "user-data": 0o600, "meta-data": 0o600} {
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s mode = %v, want %v", name, fi.Mode().Perm(), want)
			}
		}
	}
	if err := WriteSeedDir(filepath.Join(t.TempDir(), "bad"), Config{}); err == nil {
		t.Error("WriteSeedDir accepted an empty config")
	}
}
