package runtime_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
)

func TestRegistryNames(t *testing.T) {
	e := runtime.Plain(func(context.Context, runtime.Options) (runtime.Runtime, error) { return nil, nil })
	if got := (runtime.Registry{"qemu": e, "firecracker": e, "docker": e}).Names(); !slices.Equal(got, []string{"docker", "firecracker", "qemu"}) {
		t.Errorf("Names = %v, want sorted", got)
	}
	if got := runtime.Registry(nil).Names(); len(got) != 0 {
		t.Errorf("nil registry: Names = %v, want none", got)
	}
}

// fcConfig is a runtime's own typed config, as firecracker's would be.
type fcConfig struct{ Binary, Jailer string }

// TestWithConfig: a runtime's settings are parsed into its own typed config
// with defaults for what is unset, Check reports a bad value without
// building, and the factory gets the agent's options beside its config.
func TestWithConfig(t *testing.T) {
	if k, f := runtime.EnvKey("firecracker", "JAILER_BINARY"), runtime.FlagName("firecracker", "JAILER_BINARY"); k != "NODE_AGENT_FIRECRACKER_JAILER_BINARY" || f != "firecracker-jailer-binary" {
		t.Errorf("EnvKey, FlagName = %q, %q", k, f)
	}
	var got fcConfig
	var gotRoot string
	e := runtime.WithConfig(func(v runtime.Values) (fcConfig, error) {
		if v["BINARY"] == "bad" {
			return fcConfig{}, errors.New("NODE_AGENT_FIRECRACKER_BINARY: bad")
		}
		return fcConfig{Binary: v["BINARY"], Jailer: v["JAILER"]}, nil
	}, func(_ context.Context, o runtime.Options, c fcConfig) (runtime.Runtime, error) {
		got, gotRoot = c, o.Root
		return nil, nil
	}, runtime.Setting{Name: "BINARY", Default: "firecracker"}, runtime.Setting{Name: "JAILER", Default: "jailer"})
	if _, err := e.Build(context.Background(), runtime.Options{Root: "/r"}, runtime.Values{"JAILER": "/opt/jailer"}); err != nil {
		t.Fatal(err)
	}
	if want := (fcConfig{Binary: "firecracker", Jailer: "/opt/jailer"}); got != want || gotRoot != "/r" {
		t.Errorf("factory got %+v, root %q; want %+v, /r", got, gotRoot, want)
	}
	if err := e.Check(runtime.Values{"BINARY": "bad"}); err == nil {
		t.Error("Check accepted a value the parser refuses")
	}
	if err := e.Check(nil); err != nil {
		t.Errorf("Check with defaults: %v", err)
	}
	if _, err := (runtime.Entry{}).Build(context.Background(), runtime.Options{}, nil); err == nil {
		t.Error("the zero Entry built a runtime")
	}
}
