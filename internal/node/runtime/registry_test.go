package runtime_test

import (
	"context"
	"slices"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
)

func TestRegistryNames(t *testing.T) {
	f := func(context.Context, runtime.Options) (runtime.Runtime, error) { return nil, nil }
	if got := (runtime.Registry{"qemu": f, "firecracker": f, "docker": f}).Names(); !slices.Equal(got, []string{"docker", "firecracker", "qemu"}) {
		t.Errorf("Names = %v, want sorted", got)
	}
	if got := runtime.Registry(nil).Names(); len(got) != 0 {
		t.Errorf("nil registry: Names = %v, want none", got)
	}
}
