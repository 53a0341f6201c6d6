package reconcile

import (
	"context"
	"maps"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// set makes (gen, phase, reason, msg) the instance's status, publishes it
// and reports it if it is a transition. It returns whether the current
// status has been reported successfully.
func (w *worker) set(ctx context.Context, gen int64, phase api.InstancePhase, reason api.ReasonCode, msg string) bool {
	prev := w.cur
	w.cur = status{gen: gen, phase: phase, reason: reason, message: msg}
	if prev.gen != gen || prev.phase != phase || prev.reason != reason {
		w.log.Info("instance status", "generation", gen, "phase", phase, "reason", reason, "message", msg)
	}
	w.publish()
	return w.flush(ctx)
}

// flush reports the current status unless the last successful report
// already carried the same (generation, phase, reason). A failure is
// retried by the next pass, with whatever the status is then.
func (w *worker) flush(ctx context.Context) bool {
	if w.cur.phase == "" {
		return true
	}
	key := statusKey{gen: w.cur.gen, phase: w.cur.phase, reason: w.cur.reason}
	if w.lastOK && w.last == key {
		return true
	}
	rep := api.InstanceStatusReport{
		Generation: w.cur.gen,
		Phase:      w.cur.phase,
		ReasonCode: w.cur.reason,
		Message:    w.cur.message,
		At:         w.now(),
		Runtime:    w.runtimeInfo(),
	}
	if err := w.r.rep.ReportStatus(ctx, w.id, rep); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("status report failed; retrying on the next pass", "phase", rep.Phase, "reason", rep.ReasonCode, "err", err)
		}
		return false
	}
	w.last, w.lastOK = key, true
	return true
}

// runtimeInfo is what the report says about the runtime instance; nil when
// there is none.
func (w *worker) runtimeInfo() *api.InstanceRuntime {
	if !w.exists {
		return nil
	}
	info := &api.InstanceRuntime{
		Runtime:  runtimeName(w.r.rt, w.st.Spec),
		Accel:    w.st.Accel,
		PID:      w.st.PID,
		Ports:    maps.Clone(w.st.Ports),
		Restarts: w.restarts,
	}
	if !w.st.StartedAt.IsZero() {
		t := w.st.StartedAt
		info.StartedAt = &t
	}
	return info
}

// publish updates the instance's entry in Instances and Allocated.
func (w *worker) publish() {
	d, inSet, draining, have := w.r.desiredOf(w.id)
	if !inSet {
		d = w.d
	}
	obs := Observed{
		ID:         w.id,
		Name:       d.Name,
		Generation: w.cur.gen,
		Phase:      w.cur.phase,
		Reason:     w.cur.reason,
		Message:    w.cur.message,
		Resources:  d.Spec.Resources(),
	}
	if d.ID == "" && w.exists { // adopted, not (yet) desired
		res := w.st.Spec.Resources
		obs.Resources = api.Capacity{VCPUs: res.VCPUs, MemoryMiB: res.MemoryMiB, DiskGiB: res.DiskGiB}
	}
	if obs.Phase == "" && w.exists { // nothing decided yet: say what the runtime says
		obs.Phase = observedPhase(w.st)
	}
	if info := w.runtimeInfo(); info != nil {
		obs.Runtime = *info
	}
	running := d.DesiredState == api.DesiredRunning || d.DesiredState == ""
	holds := have && inSet && running && !draining && obs.Phase != api.InstanceStopped
	w.r.publish(w.id, observedEntry{obs: obs, holds: holds})
}

func observedPhase(st runtime.Status) api.InstancePhase {
	switch {
	case st.State == runtime.StateRunning && st.Ready:
		return api.InstanceReady
	case st.State == runtime.StateRunning:
		return api.InstanceBooting
	case st.State == runtime.StateCreated:
		return api.InstancePending
	default:
		return api.InstanceStopped
	}
}
