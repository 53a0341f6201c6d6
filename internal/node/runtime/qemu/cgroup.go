package qemu

import (
	"github.com/drover-dev/drover/internal/node/runtime"
)

// DefaultCgroupOverheadMiB is what a QEMU process may use beyond its
// guest's memory (device emulation, TCG's translation cache, QMP) before
// its cgroup's limit OOM-kills it.
const DefaultCgroupOverheadMiB = 512

// cgroupLimit is the memory limit of an instance's cgroup, bytes (0: the
// spec sets no memory, so no limit).
func (r *Runtime) cgroupLimit(spec runtime.Spec) int64 {
	if spec.Resources.MemoryMiB <= 0 {
		return 0
	}
	over := r.opts.CgroupOverheadMiB
	if over <= 0 {
		over = DefaultCgroupOverheadMiB
	}
	return int64(spec.Resources.MemoryMiB+over) << 20
}

// placeInCgroup moves a freshly started QEMU into a new cgroup of its own
// (counters from an earlier run are dropped first). No Options.Cgroups: a
// no-op.
func (r *Runtime) placeInCgroup(id string, spec runtime.Spec, pid int) error {
	if r.opts.Cgroups == nil {
		return nil
	}
	if g, err := r.opts.Cgroups.Group(id); err == nil {
		_ = g.Remove()
	}
	g, err := r.opts.Cgroups.Create(id, r.cgroupLimit(spec))
	if err != nil {
		return err
	}
	return g.AddProcess(pid)
}

// cgroupVerdict says whether the kernel OOM-killed the instance's QEMU
// (then the exit is crashed with oom_killed), and removes its cgroup.
func (r *Runtime) cgroupVerdict(id string, stopRequested bool) (oom bool) {
	if r.opts.Cgroups == nil {
		return false
	}
	g, err := r.opts.Cgroups.Group(id)
	if err != nil {
		return false
	}
	if !stopRequested {
		if killed, err := g.OOMKilled(); err == nil && killed {
			oom = true
		}
	}
	if err := g.Remove(); err != nil {
		r.log.Warn("remove cgroup", "id", id, "err", err)
	}
	return oom
}

// removeCgroup deletes an instance's cgroup (Destroy).
func (r *Runtime) removeCgroup(id string) {
	if r.opts.Cgroups == nil {
		return
	}
	if g, err := r.opts.Cgroups.Group(id); err == nil {
		if err := g.Remove(); err != nil {
			r.log.Warn("remove cgroup", "id", id, "err", err)
		}
	}
}

// oomDetail is the exit detail of an OOM-killed QEMU.
const oomDetail = "the kernel OOM-killed qemu: its memory cgroup limit was reached"
