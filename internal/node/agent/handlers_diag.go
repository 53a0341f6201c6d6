package agent

import (
	"context"
	"maps"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/diag"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// DefaultHandlers are the task types every agent runs: diagnostics and
// the GPU slice family.
func DefaultHandlers(cfg Config) Handlers {
	accelCache := accel.New(accel.Config{CacheDir: cfg.StateDir})
	h := Handlers{
		"diag.health_probe": {Timeout: 30 * time.Second, Run: func(ctx context.Context, t Task) (Outcome, error) {
			p, err := diag.DecodeParams(t.Params)
			if err != nil {
				return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: err.Error()}}
			}
			// One read of the accelerator verdict (proven at agent start,
			// cached for the boot) feeds both the kvm check and the
			// report's accelerator_probe, so they cannot disagree.
			res, cached := accelCache.Cached()
			prober := diag.NewProber(diag.Config{DefaultDiagnosticPath: cfg.StateDir,
				KVMVerdict: func() (diag.KVMVerdict, bool) { return kvmVerdict(res, cached) },
				OtherAccel: otherAccel(cfg.QEMUAccel, res, cached)})
			rep, err := prober.Probe(ctx, p, t.Progress)
			out := healthReport{Report: rep}
			if cached {
				out.AcceleratorProbe = &res
			}
			return Outcome{Output: out, Timings: rep.Timings}, err
		}},
		"diag.echo":        EchoHandler(cfg.HostID, time.Now),
		task.TypePreflight: PreflightHandler(cfg, time.Now),
	}
	maps.Copy(h, AllocHandlers(cfg))
	for typ, handler := range SliceHandlers(cfg) {
		h[typ] = handler
	}
	return h
}

// otherAccel is the accelerator this host runs VMs with instead of KVM,
// for which the health probe does not hold a broken KVM against the host:
// the one the operator configured (NODE_AGENT_QEMU_ACCEL=tcg, nvmm, hvf),
// or, when the choice is left to the agent, the one its accelerator probe
// picked. "" when KVM is configured (a broken KVM is then ill health, even
// with a TCG fallback) or picked, or the probe has not run.
func otherAccel(configured string, res accel.Result, probed bool) string {
	sel := configured
	if sel == "" && probed {
		sel = accel.Default(res)
	}
	if sel == "" || sel == accel.KVM {
		return ""
	}
	return sel
}

// healthReport is diag.health_probe's output: the probe's report plus the
// accelerator probe result (which accelerators really work, and why not).
type healthReport struct {
	diag.Report
	AcceleratorProbe *accel.Result `json:"accelerator_probe,omitempty"`
}

// kvmVerdict hands the cached accelerator probe's verdict on kvm to the
// health probe's kvm check, so that the check (and healthy) agree with
// the accelerator_probe the report carries.
func kvmVerdict(res accel.Result, ok bool) (diag.KVMVerdict, bool) {
	if !ok {
		return diag.KVMVerdict{}, false
	}
	s, ok := res.Status(accel.KVM)
	if !ok {
		return diag.KVMVerdict{}, false
	}
	return diag.KVMVerdict{Works: s.Works, Reason: s.Reason, Detail: s.Detail}, true
}
