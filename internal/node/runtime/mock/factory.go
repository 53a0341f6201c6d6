package mock

import (
	"context"

	"github.com/drover-dev/drover/internal/node/runtime"
)

// Name is the adapter's registry name (NODE_AGENT_RUNTIME=mock).
const Name = "mock"

var _ runtime.Factory = Factory

// Factory builds an empty mock runtime; register it as
// runtime.Registry{mock.Name: mock.Factory}. It uses only opts.Log.
func Factory(_ context.Context, opts runtime.Options) (runtime.Runtime, error) {
	return New(Options{Log: opts.Log}), nil
}
