package mock

import (
	"context"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Name is the adapter's registry name (NODE_AGENT_RUNTIME=mock).
const Name = "mock"

var _ runtime.Factory = Factory

// Entry is the mock's registration: runtime.Registry{mock.Name:
// mock.Entry()}. The mock has no settings of its own.
func Entry() runtime.Entry { return runtime.Plain(Factory) }

// Factory builds an empty mock runtime. It uses only opts.Log.
func Factory(_ context.Context, opts runtime.Options) (runtime.Runtime, error) {
	return New(Options{Log: opts.Log}), nil
}
