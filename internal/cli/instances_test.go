package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// startServerWithHost runs a control plane whose store holds one healthy
// host "h1" with 4 vCPU and 4 GiB to give.
func startServerWithHost(t *testing.T) (apiURL, token string, st store.Store) {
	t.Helper()
	apiURL, token = startServer(t, func(ctx context.Context, s store.Store) error {
		st = s
		capa, _ := json.Marshal(api.CapacityReport{Total: api.Capacity{VCPUs: 4, MemoryMiB: 4096, DiskGiB: 50}})
		return s.CreateHost(ctx, store.Host{ID: "h1", OSFamily: api.OSLinux, Enabled: true, Status: api.HostHealthy,
			Capacity: capa, Labels: map[string]string{"rack": "a"}})
	})
	return apiURL, token, st
}

func TestInstanceCommands(t *testing.T) {
	apiURL, token, st := startServerWithHost(t)
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append(args, "--api", apiURL, "--token", token), &Env{Stdout: &out, Stderr: &errb})
		return code, out.String(), errb.String()
	}
	dir := t.TempDir()
	sha := strings.Repeat("ab", 32)
	specFile := filepath.Join(dir, "spec.json")
	spec := api.InstanceSpec{Image: api.Artifact{URL: "https://img.example/a.qcow2", SHA256: sha}, VCPUs: 2, MemoryMiB: 256,
		Network: api.NetworkSpec{Forwards: []api.PortForward{{Name: "old", GuestPort: 1}}}}
	b, _ := json.Marshal(spec)
	keyFile := filepath.Join(dir, "keys")
	for path, data := range map[string][]byte{specFile: b, keyFile: []byte("# mine\nssh-ed25519 AAAA me@x\n\nssh-rsa BBBB other\n"),
		filepath.Join(dir, "bad.json"): []byte(`{"vcpus":1,"bogus":true}`)} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	image := []string{"--image-url", "https://img.example/a.qcow2", "--image-sha256", sha}

	tests := []struct {
		name     string
		args     []string
		code     int
		contains string // in stdout for code 0, stderr otherwise
	}{
		{"create", append([]string{"instances", "create", "web-1", "--group", "web", "--vcpus", "1", "--memory-mib", "128",
			"--host", "h1"}, image...), 0, "phase:          Pending"},
		{"create by label", append([]string{"instances", "create", "db-1", "--vcpus", "1", "--memory-mib", "128",
			"--host-label", "rack=a"}, image...), 0, "host_id:        h1"},
		{"invalid", []string{"instances", "create", "Bad!", "--vcpus", "0"}, 1, "spec.image.url"},
		{"host and host-label", append([]string{"instances", "create", "x", "--host", "h1", "--host-label", "rack=a"}, image...), 2, "can't be used together"},
		{"bad forward", append([]string{"instances", "create", "x", "--forward", "http"}, image...), 1, "name:guestport"},
		{"bad spec file", []string{"instances", "create", "x", "--spec", filepath.Join(dir, "bad.json")}, 1, "bogus"},
		{"too big", append([]string{"instances", "create", "big", "--vcpus", "1000", "--memory-mib", "128"}, image...), 1, "insufficient_capacity"},
		{"list", []string{"instances", "list"}, 0, "web-1"},
		{"list group", []string{"instances", "list", "--group", "web"}, 0, "0/1"},
		{"show by name", []string{"instances", "show", "web-1"}, 0, "resources:      1 vCPU, 128 MiB"},
		{"show unknown", []string{"instances", "show", "nope"}, 1, "instance_not_found"},
		{"wait times out", []string{"instances", "show", "web-1", "--wait-phase", "Ready", "--timeout", "600ms"}, 1, "still Pending after 600ms"},
		{"bad phase", []string{"instances", "show", "web-1", "--wait-phase", "Up"}, 1, "not a phase"},
		{"stop", []string{"instances", "stop", "web-1"}, 0, "desired_state:  stopped"},
		{"start", []string{"instances", "start", "web-1"}, 0, "generation:     3 (observed 0)"},
		{"scale up", []string{"instances", "scale", "web", "--replicas", "2"}, 0, "created web-2"},
		{"scale down", []string{"instances", "scale", "web", "--replicas", "1"}, 0, "deleting i-"},
		{"scale empty group", []string{"instances", "scale", "none", "--replicas", "1"}, 1, "template"},
		{"delete", []string{"instances", "delete", "db-1"}, 0, "deleting db-1"},
		{"force delete", []string{"instances", "delete", "db-1", "--force"}, 0, "removed db-1"},
		{"drain", []string{"hosts", "drain", "h1"}, 0, "draining:            true"},
		{"no room while draining", append([]string{"instances", "create", "late", "--vcpus", "1", "--memory-mib", "64"}, image...), 1, "h1: draining"},
		{"undrain", []string{"hosts", "undrain", "h1"}, 0, "draining:            false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := run(tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out, errOut)
			}
			where := out
			if code != 0 {
				where = errOut
			}
			if !strings.Contains(where, tt.contains) {
				t.Fatalf("output lacks %q:\nstdout: %s\nstderr: %s", tt.contains, out, errOut)
			}
		})
	}

	// --spec is the base; flags override it.
	code, out, errOut := run("instances", "create", "spec-1", "--spec", specFile, "--vcpus", "1", "--forward", "http:80",
		"--forward", "ssh:22:2222", "--ready-port", "80", "--ready-marker", "login:", "--ssh-key", keyFile, "--user", "ops",
		"--kernel-url", "https://img.example/vmlinuz", "--kernel-sha256", sha, "--cmdline", "console=ttyS0", "--json")
	if code != 0 {
		t.Fatalf("create from spec: exit %d: %s", code, errOut)
	}
	var in api.Instance
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatal(err)
	}
	s := in.Spec
	if s.VCPUs != 1 || s.MemoryMiB != 256 || s.Image.URL != spec.Image.URL || len(s.Network.Forwards) != 2 ||
		s.Network.Forwards[1] != (api.PortForward{Name: "ssh", GuestPort: 22, HostPort: 2222}) ||
		s.Readiness.TCPPort != 80 || s.Readiness.SerialMarker != "login:" || s.CloudInit == nil || s.CloudInit.User != "ops" ||
		len(s.CloudInit.SSHAuthorizedKeys) != 2 || s.Boot == nil || s.Boot.Cmdline != "console=ttyS0" || s.Boot.Initrd != nil {
		t.Fatalf("spec from file and flags: %+v", s)
	}

	// --wait-phase returns once the agent's report lands, and a failure
	// ends the wait with its reason.
	setPhase := func(name string, phase api.InstancePhase, reason api.ReasonCode) {
		go func() {
			time.Sleep(700 * time.Millisecond)
			got, err := st.GetInstanceByName(context.Background(), name)
			if err == nil {
				_, err = st.UpdateInstance(context.Background(), got.ID, func(i *store.Instance) error {
					i.Phase, i.ReasonCode, i.Message = phase, reason, "from test"
					return nil
				})
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	setPhase("spec-1", api.InstanceReady, "")
	if code, out, errOut := run("instances", "show", "spec-1", "--wait-phase", "Ready", "--timeout", "10s"); code != 0 || !strings.Contains(out, "phase:          Ready") {
		t.Fatalf("wait for Ready: exit %d\n%s%s", code, out, errOut)
	}
	setPhase("web-1", api.InstanceFailed, api.ReasonImagePullFailed)
	if code, _, errOut := run("instances", "show", "web-1", "--wait-phase", "Ready", "--timeout", "10s"); code != 1 || !strings.Contains(errOut, "Failed (image_pull_failed): from test") {
		t.Fatalf("wait on a failing instance: exit %d, %s", code, errOut)
	}
}

func TestParseForward(t *testing.T) {
	tests := []struct {
		in   string
		want api.PortForward
		ok   bool
	}{
		{"http:80", api.PortForward{Name: "http", GuestPort: 80}, true},
		{"ssh:22:2222", api.PortForward{Name: "ssh", GuestPort: 22, HostPort: 2222}, true},
		{"http", api.PortForward{}, false},
		{":80", api.PortForward{}, false},
		{"a:b", api.PortForward{}, false},
		{"a:1:b", api.PortForward{}, false},
		{"a:1:2:3", api.PortForward{}, false},
	}
	for _, tt := range tests {
		got, err := parseForward(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseForward(%q) = %+v, %v; want %+v ok=%t", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
