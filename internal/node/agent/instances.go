package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/reconcile"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/slicedhcp"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
)

// instancesPollWait is how long one desired-set long-poll may wait.
const instancesPollWait = 30 * time.Second

// orphanSweepEvery is the period of a runtime's orphan safety loop
// (runtime.OrphanSweeper).
const orphanSweepEvery = time.Minute

// vmSide is what the agent runs instances with: the runtime, the reconciler
// that converges declared instances on it, and the slice provisioner for
// slice.vm_provision / slice.vm_release.
type vmSide struct {
	rt     runtime.Runtime
	rec    *reconcile.Reconciler
	slices *slicevm.Provisioner
	pulls  *ollamaPulls // Ollama presets' model pulls after Ready
	// sliceDHCP holds the slots' DHCP reservations; root is the runtime
	// dir (the slice network's state lives below it).
	sliceDHCP *slicedhcp.Store
	root      string
}

// buildRuntime builds the configured runtimes (from cfg.Runtimes), image
// cache, reconciler and slice provisioner. NODE_AGENT_RUNTIME=none (or an
// empty Runtime in a Config built by hand; LoadConfig defaults to qemu)
// and no NODE_AGENT_CONTAINER_RUNTIME give nil. With both, a
// runtime.Router runs VMs on the one and containers on the other
// (docs/adr/0008-container-runtime.md); when one of the two cannot be
// built (no accelerator, no engine) the host runs the other alone.
func (a *Agent) buildRuntime(ctx context.Context) (*vmSide, error) {
	kind, ckind := a.cfg.Runtime, a.cfg.ContainerRuntime
	if kind == RuntimeNone {
		kind = ""
	}
	if ckind == RuntimeNone {
		ckind = ""
	}
	if a.runtime == nil && kind == "" && ckind == "" {
		return nil, nil
	}
	root := a.cfg.RuntimeDir
	if root == "" {
		root = filepath.Join(a.cfg.StateDir, "runtime")
	}
	images, err := image.NewCache(image.Options{Dir: filepath.Join(root, "images"),
		AllowedDirs: a.cfg.imageDirs(), AllowLocalURLs: a.cfg.ImageAllowLocalURLs, Log: a.log})
	if err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	v := &vmSide{rt: a.runtime}
	if v.rt == nil {
		a.mu.Lock()
		acc := a.cfg.QEMUAccel // the probe's selection (or its fallback)
		a.mu.Unlock()
		opts := runtime.Options{Root: root, Images: images, Accel: acc, Log: a.log, GPUs: a.hostGPUs,
			OnOrphanRemoved:  func(string) { a.metrics.orphanOverlays.Inc() },
			OCICacheMaxBytes: a.cfg.OCICacheMaxBytes(),
			HostRoot:         a.cfg.hostRoot(),
			MicroVMBridge:    a.cfg.MicroVMBridge, MicroVMCIDR: a.cfg.MicroVMCIDR, MicroVMDNS: a.cfg.microVMDNS()}
		var vm, ct runtime.Runtime
		var vmErr, ctErr error
		if kind != "" {
			vm, vmErr = a.buildOne(ctx, kind, opts)
		}
		if ckind != "" {
			co := opts
			co.Root = filepath.Join(root, ckind)
			ct, ctErr = a.buildOne(ctx, ckind, co)
		}
		switch {
		case vm != nil && ct != nil:
			v.rt = runtime.NewRouter(vm, ct)
		case vm != nil:
			if ctErr != nil {
				a.log.Error("container runtime unavailable; this host runs VMs only", "runtime", ckind, "err", ctErr)
			}
			v.rt = vm
		case ct != nil:
			if vmErr != nil {
				a.log.Error("VM runtime unavailable; this host runs containers only", "runtime", kind, "err", vmErr)
			}
			v.rt = ct
		default:
			return nil, errors.Join(vmErr, ctErr)
		}
	}
	v.rec = reconcile.New(v.rt, statusReporter{a}, reconcile.Options{Interval: a.cfg.ReconcileInterval,
		BackoffBase: a.cfg.RestartBackoff, BackoffMax: a.cfg.RestartBackoffMax, CrashLoopThreshold: a.cfg.CrashLoopThreshold,
		Secrets: a.instanceSecrets, Log: a.log})
	v.pulls = newOllamaPulls(ctx, a.postStatus, a.log)
	v.root = root
	if v.sliceDHCP, err = a.openSliceDHCP(ctx, v.rt, root); err != nil {
		return nil, err
	}
	sysfs := a.sliceRoot
	if sysfs == "" {
		sysfs = "/"
	}
	v.slices, err = slicevm.New(slicevm.Options{Runtime: v.rt, Images: images, SysfsRoot: sysfs,
		DeviceDirs: a.sliceDevDirs, StateDir: filepath.Join(root, "slices"), CloudInitDir: filepath.Join(root, "cloud-init"),
		Log: a.log, CheckAccel: a.checkAccel, DHCP: v.sliceDHCP, InstallDependencies: a.cfg.SliceInstallDependencies})
	if err != nil {
		return nil, fmt.Errorf("slice provisioner: %w", err)
	}
	return v, nil
}

// buildOne builds the registered runtime name.
func (a *Agent) buildOne(ctx context.Context, name string, o runtime.Options) (runtime.Runtime, error) {
	entry, ok := a.cfg.Runtimes[name]
	if !ok { // Validate saw to it; a Config changed since would land here
		return nil, fmt.Errorf("runtime %q is not registered in this binary", name)
	}
	rt, err := entry.Build(ctx, o, a.cfg.runtimeValues(name))
	if err != nil {
		return nil, fmt.Errorf("%s runtime: %w", name, err)
	}
	return rt, nil
}

// checkAccel says whether an accelerator works here, from the probe run at
// start ("" is the selected one).
func (a *Agent) checkAccel(_ context.Context, name string) error {
	a.mu.Lock()
	res, selected := a.accel, a.cfg.QEMUAccel
	a.mu.Unlock()
	if name == "" {
		name = selected
	}
	if name == "" {
		return errors.New("no working accelerator on this host")
	}
	return accel.Select(res, name)
}

// readSecret reads an instance secret from NODE_AGENT_SECRETS_DIR. A name
// that is not there wraps fs.ErrNotExist (the reconciler reports
// secrets_missing); any other failure is secrets_injection_failed.
func (a *Agent) readSecret(name string) ([]byte, error) {
	if a.cfg.SecretsDir == "" {
		return nil, fmt.Errorf("secret %q: NODE_AGENT_SECRETS_DIR is not set: %w", name, fs.ErrNotExist)
	}
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return nil, fmt.Errorf("secret %q: not a plain file name: %w", name, fs.ErrNotExist)
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.SecretsDir, name))
	if err != nil {
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	return b, nil
}

// runVMs runs the reconciler, the desired-set long-poll and, for a runtime
// that has one, its orphan safety loop until ctx ends.
func (a *Agent) runVMs(ctx context.Context, v *vmSide) error {
	done := make(chan error, 1)
	go func() { done <- v.rec.Run(ctx) }()
	if s, ok := v.rt.(runtime.OrphanSweeper); ok {
		go s.RunOrphanLoop(ctx, orphanSweepEvery)
	}
	go a.runSliceNetwork(ctx, v.sliceDHCP, v.root)
	if r, ok := v.rt.(runtime.Releaser); ok {
		// Let go of the VMs without stopping them: they outlive the agent
		// and the next one re-adopts them.
		defer r.Close()
	}
	err := a.instancesLoop(ctx, v.rec)
	if rerr := <-done; err == nil && !errors.Is(rerr, context.Canceled) {
		err = rerr
	}
	return err
}

// instancesLoop long-polls the node's desired instance set and hands every
// change to the reconciler. The server answers at once when the set differs
// from the ETag we hold, else when it changes or the wait ends.
func (a *Agent) instancesLoop(ctx context.Context, rec *reconcile.Reconciler) error {
	bo := newBackoff(time.Second, time.Minute)
	etag := ""
	for {
		pctx, cancel := context.WithTimeout(ctx, instancesPollWait+15*time.Second)
		set, err := a.node.DesiredInstances(pctx, a.node.node(), instancesPollWait, etag)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			wait := max(bo.next(), retryAfter(err))
			a.log.Warn("fetch desired instances failed", "err", err, "retry_in", wait.Round(time.Millisecond))
			if err := sleepUntil(ctx, a.now, a.now().Add(wait)); err != nil {
				return nil
			}
			continue
		}
		bo.reset()
		if set.ETag != etag || etag == "" {
			etag = set.ETag
			rec.SetDesired(set.Instances, set.Draining)
		}
	}
}

// statusReporter posts instance transitions to the control plane.
type statusReporter struct{ a *Agent }

// ReportStatus posts one transition. An instance the control plane no longer
// knows (404: deleted with --force) needs no report.
func (r statusReporter) ReportStatus(ctx context.Context, id string, rep api.InstanceStatusReport) error {
	err := r.a.postStatus(ctx, id, rep)
	if err == nil {
		r.a.afterStatus(id, rep)
	}
	if IsStatus(err, http.StatusNotFound) {
		r.a.log.Info("instance unknown to the control plane; status not reported", "instance_id", id, "phase", rep.Phase)
		return nil
	}
	return err
}
