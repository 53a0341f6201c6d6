package reconcile

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestToRuntimeSpecMicroVMVolumes: a microVM's container.volumes become
// runtime volumes with their size, format and read-only flag; a spec
// without volumes encodes as before (no "volumes" key), so no instance is
// recreated by the upgrade.
func TestToRuntimeSpecMicroVMVolumes(t *testing.T) {
	base := api.InstanceSpec{Runtime: api.RuntimeMicroVM, VCPUs: 1, MemoryMiB: 256,
		Container: &api.ContainerSpec{Image: "reg.example/pg:16"}}
	for _, tc := range []struct {
		name string
		in   []api.VolumeMount
		want []runtime.Volume
	}{
		{"none", nil, nil},
		{"defaults", []api.VolumeMount{{Source: "pgdata", Target: "/var/lib/pg"}},
			[]runtime.Volume{{Source: "pgdata", Target: "/var/lib/pg"}}},
		{"size, format, read-only", []api.VolumeMount{
			{Source: "pgdata", Target: "/var/lib/pg", SizeGiB: 20, Format: api.VolumeFormatQCOW2},
			{Source: "seed", Target: "/seed", ReadOnly: true, Format: api.VolumeFormatRaw}},
			[]runtime.Volume{{Source: "pgdata", Target: "/var/lib/pg", SizeGiB: 20, Format: "qcow2"},
				{Source: "seed", Target: "/seed", ReadOnly: true, Format: "raw"}}},
	} {
		s := base
		c := *base.Container
		c.Volumes = tc.in
		s.Container = &c
		got := ToRuntimeSpec(api.DesiredInstance{ID: "mv", Spec: s}, nil)
		if diff := cmp.Diff(tc.want, got.Volumes); diff != "" {
			t.Errorf("%s: volumes (-want +got):\n%s", tc.name, diff)
		}
		if !got.VMOrZero().MicroVM {
			t.Errorf("%s: not a microVM spec", tc.name)
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		if has := strings.Contains(string(b), `"volumes"`); has != (len(tc.in) > 0) {
			t.Errorf("%s: spec JSON %s", tc.name, b)
		}
		if len(tc.in) > 0 && tc.in[0].SizeGiB == 0 && strings.Contains(string(b), `"size_gib"`) {
			t.Errorf("%s: a default size is encoded: %s", tc.name, b)
		}
	}
}
