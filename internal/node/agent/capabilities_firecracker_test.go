package agent_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/firecracker"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestCapabilitiesFirecrackerHonest: an agent configured for firecracker
// offers it in its capabilities only when a firecracker binary exists and
// its accelerator verdict is a working KVM; otherwise it offers no
// runtime (and runs no instances). The binary is any executable: nothing
// is started here, the capability is the claim under test.
func TestCapabilitiesFirecrackerHonest(t *testing.T) {
	cases := []struct {
		name    string
		binary  string
		working []string
		want    []string
	}{
		{"no kvm", "/bin/true", []string{accel.TCG}, nil},
		{"no binary", filepath.Join(t.TempDir(), "firecracker"), []string{accel.KVM, accel.TCG}, nil},
		{"binary and kvm", "/bin/true", []string{accel.KVM, accel.TCG}, []string{firecracker.Name}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCP(t)
			cfg := testConfig(f, t.TempDir())
			cfg.Runtime = firecracker.Name
			cfg.Runtimes = noderuntime.Registry{firecracker.Name: firecracker.Entry()}
			cfg.RuntimeSettings = map[string]string{
				noderuntime.EnvKey(firecracker.Name, "BINARY"):     tc.binary,
				noderuntime.EnvKey(firecracker.Name, "JAILER_UID"): "0", noderuntime.EnvKey(firecracker.Name, "JAILER_GID"): "0"}
			startAgentConfig(t, f, cfg, agent.Handlers{}, agent.WithAccelProbe(fixedAccel(tc.working...)))
			var got api.Capabilities
			eventually(t, "a capabilities report", func() bool {
				f.mu.Lock()
				defer f.mu.Unlock()
				if len(f.caps) == 0 {
					return false
				}
				got = f.caps[len(f.caps)-1]
				return true
			})
			if !slices.Equal(got.Runtimes, tc.want) {
				t.Errorf("capabilities runtimes %v (accelerators %v, selected %q), want %v", got.Runtimes, got.Accelerators, got.SelectedAccel, tc.want)
			}
		})
	}
}
