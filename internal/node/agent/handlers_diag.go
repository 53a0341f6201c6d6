package agent

import (
	"context"
	"maps"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/diag"
	"github.com/drover-dev/drover/internal/wire/api"
)

// DefaultHandlers are the task types every agent runs: diagnostics and
// the GPU slice family.
func DefaultHandlers(cfg Config) Handlers {
	prober := diag.NewProber(diag.Config{DefaultDiagnosticPath: cfg.StateDir})
	accelCache := accel.New(accel.Config{CacheDir: cfg.StateDir})
	h := Handlers{
		"diag.health_probe": {Timeout: 30 * time.Second, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, err := diag.DecodeParams(t.Params)
			if err != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: err.Error()}}
			}
			rep, err := prober.Probe(ctx, p, t.Progress)
			out := healthReport{Report: rep}
			if res, ok := accelCache.Cached(); ok { // proven at agent start, cached for the boot
				out.AcceleratorProbe = &res
			}
			return Outcome{Output: out, Timings: rep.Timings}, err
		}},
		"diag.echo": EchoHandler(cfg.HostID, time.Now),
	}
	maps.Copy(h, AllocHandlers(cfg))
	for typ, handler := range SliceHandlers(cfg) {
		h[typ] = handler
	}
	return h
}

// healthReport is diag.health_probe's output: the probe's report plus the
// accelerator probe result (which accelerators really work, and why not).
type healthReport struct {
	diag.Report
	AcceleratorProbe *accel.Result `json:"accelerator_probe,omitempty"`
}
