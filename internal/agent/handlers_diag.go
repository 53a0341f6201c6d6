package agent

import (
	"context"
	"time"

	"github.com/drover-dev/drover/internal/diag"
)

// DefaultHandlers are the task types every agent runs: diagnostics and
// the GPU slice family.
func DefaultHandlers(cfg Config) Handlers {
	prober := diag.NewProber(diag.Config{DefaultDiagnosticPath: cfg.StateDir})
	h := Handlers{
		"diag.health_probe": {Timeout: 30 * time.Second, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, err := diag.DecodeParams(t.Params)
			if err != nil {
				return Outcome{}, &HandlerError{Code: "invalid_params", Message: err.Error()}
			}
			rep, err := prober.Probe(ctx, p, t.Progress)
			return Outcome{Output: rep, Timings: rep.Timings}, err
		}},
	}
	for typ, handler := range SliceHandlers(cfg) {
		h[typ] = handler
	}
	return h
}
