package agent

import (
	"context"
	"path/filepath"

	"github.com/drover-dev/drover/internal/node/slice"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// SliceHandlers are the GPU slice task types. slice.topology_discover only
// reads the host; its slot MACs derive from cfg.HostID (the hostname when
// that is empty, so pass the settled node id).
func SliceHandlers(cfg Config) Handlers {
	return sliceHandlers(cfg, slice.NewDiscoverer(slice.Config{HostID: cfg.HostID}))
}

// sliceHandlersAt are SliceHandlers reading the host below root
// (WithSliceHost); devices are named where this agent opens them, below
// root (slice.vm_provision reads such paths as they are).
func sliceHandlersAt(cfg Config, root string) Handlers {
	dev := filepath.Join(root, "dev")
	return sliceHandlers(cfg, slice.NewDiscoverer(slice.Config{HostID: cfg.HostID, SysRoot: filepath.Join(root, "sys"),
		ProcRoot: filepath.Join(root, "proc"), DevRoot: dev, DevPath: dev, RootDir: root}))
}

func sliceHandlers(cfg Config, d *slice.Discoverer) Handlers {
	return Handlers{
		slice.TaskType: {Timeout: task.TopologyDiscoverTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, err := slice.DecodeParams(t.Params)
			if err != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: err.Error()}}
			}
			topo, timings, err := d.Discover(ctx, p, t.Progress)
			if err != nil && ctx.Err() == nil {
				err = &HandlerError{api.CodedError{Code: "topology_discover_failed", Message: err.Error()}}
			}
			if err != nil {
				return Outcome{Timings: timings}, err
			}
			return Outcome{Output: topo, Timings: timings}, nil
		}},
	}
}
