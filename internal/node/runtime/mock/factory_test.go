package mock

import (
	"context"
	"testing"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// TestFactory: the registry's factory builds an empty mock, and the mock
// offers none of the optional extras (no orphan loop, nothing to release).
func TestFactory(t *testing.T) {
	rt, err := Entry().Build(context.Background(), runtime.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Name() != Name {
		t.Errorf("Name = %q, want %q", rt.Name(), Name)
	}
	if l, err := rt.List(context.Background()); err != nil || len(l) != 0 {
		t.Errorf("List = %v, %v; want empty", l, err)
	}
	if _, ok := rt.(runtime.OrphanSweeper); ok {
		t.Error("the mock is an OrphanSweeper")
	}
	if _, ok := rt.(runtime.Releaser); ok {
		t.Error("the mock is a Releaser")
	}
}
