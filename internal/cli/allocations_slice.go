package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// SliceFlags are the slice allocation flags of allocations create.
type SliceFlags struct {
	Slots       int    `name:"slots" help:"Create a slice allocation: a VM with this many approved slots (GPU, fabric VF, NVMe) of one host (--host, or placed)."`
	Image       string `name:"image" help:"Slice VM disk image URL (http, https or file)."`
	ImageSHA256 string `name:"image-sha256" help:"SHA-256 of the slice VM image."`
	VCPUs       int    `name:"vcpus" help:"vCPUs per slot (default 12)."`
	MemoryMiB   int    `name:"memory-mib" help:"Memory per slot in MiB (default 65536)."`
	NoWipe      bool   `name:"no-wipe" help:"Do not zero the slots' NVMe namespaces on release."`
	// ReadinessMarker and ReadinessTimeout are the request's
	// readiness_marker and readiness_timeout_seconds.
	ReadinessMarker  string        `name:"readiness-marker" help:"Serial console line that means the slice VM booted (default \"DROVER-READY <vm_name>\", which Drover's cloud-init seed prints); an image that prints its own line names it here."`
	ReadinessTimeout time.Duration `name:"readiness-timeout" help:"How long the node waits for the readiness marker and then the guest's SSH, e.g. 4m (5s to 15m, whole seconds; default 10m)."`
	Wait             bool          `name:"wait" help:"Follow a slice allocation's workflow (steps and phases, live) until it is active or failed."`
}

func (f SliceFlags) request() (api.SliceRequest, error) {
	r := api.SliceRequest{Slots: f.Slots, Image: f.Image, ImageSHA256: f.ImageSHA256, VCPUs: f.VCPUs, MemoryMiB: f.MemoryMiB,
		ReadinessMarker: f.ReadinessMarker}
	if f.NoWipe {
		no := false
		r.WipeOnRelease = &no
	}
	if f.ReadinessTimeout != 0 {
		if f.ReadinessTimeout < 0 || f.ReadinessTimeout%time.Second != 0 {
			return r, fmt.Errorf("--readiness-timeout %s: must be a positive whole number of seconds", f.ReadinessTimeout)
		}
		r.ReadinessTimeoutSeconds = int(f.ReadinessTimeout / time.Second)
	}
	return r, nil
}

// waitSlice follows an allocation until it leaves provisioning, printing
// each step and phase as it starts and ends (on stderr with --json).
func waitSlice(ctx context.Context, env *Env, cl *operatorClient, a api.Allocation, asJSON bool) (api.Allocation, error) {
	out := env.Stdout
	if asJSON {
		out = env.Stderr
	}
	seen := map[string]bool{}
	for {
		report(out, a.Workflow, seen)
		if a.State != api.AllocationProvisioning && a.State != api.AllocationReleasing {
			return a, nil
		}
		select {
		case <-ctx.Done():
			return a, ctx.Err()
		case <-time.After(time.Second):
		}
		if err := cl.call(ctx, http.MethodGet, "/api/v1/allocations/"+a.ID, nil, nil, &a); err != nil {
			return a, err
		}
	}
}

// report prints the steps and phases not printed yet.
func report(w io.Writer, wf *api.SliceWorkflow, seen map[string]bool) {
	if wf == nil {
		return
	}
	for _, st := range wf.Steps {
		key := "step " + st.Step + " " + st.State
		if seen[key] {
			continue
		}
		seen[key] = true
		if st.State == "started" {
			fmt.Fprintf(w, "step %-26s started\n", st.Step)
			continue
		}
		fmt.Fprintf(w, "step %-26s %-8s %6d ms  %s\n", st.Step, st.State, st.DurationMS, st.Detail)
	}
	for _, ph := range wf.Phases {
		key := "phase " + ph.Phase + " " + ph.Status
		if seen[key] {
			continue
		}
		seen[key] = true
		fmt.Fprintf(w, "  phase %-24s %-8s %6d ms  %s\n", ph.Phase, ph.Status, ph.DurationMS, ph.Detail)
	}
}

// printWorkflow adds a slice workflow's rows to an allocation's table.
func printWorkflow(w io.Writer, wf *api.SliceWorkflow) {
	if wf == nil {
		return
	}
	fmt.Fprintf(w, "workflow\t%s (step %s)\n", wf.Status, wf.Step)
	if wf.VMName != "" {
		fmt.Fprintf(w, "vm\t%s\n", wf.VMName)
	}
	for _, s := range wf.Slots {
		fmt.Fprintf(w, "slot\t%s gpu=%s fabric=%s nvme=%s numa=%d mac=%s ip=%s\n", s.SlotID, s.PCIAddress,
			orNone(s.FabricDevice), orNone(s.NVMeDevice), s.NUMANode, s.MACAddress, s.PrivateIP)
	}
	if wf.VM != nil {
		fmt.Fprintf(w, "address\t%s (ssh %s:%d, user %s, ready %v, console %s, raw_vnc %v)\n", wf.VM.PrivateIP, wf.VM.SSHHost, wf.VM.SSHPort,
			wf.VM.DefaultUser, wf.VM.Ready, wf.VM.ConsoleModel, wf.VM.RawVNC)
	}
	if wf.FailedStep != "" {
		fmt.Fprintf(w, "failed\tstep %s, signal %s: %s (correlation_id %s)\n", wf.FailedStep, wf.Signal, wf.Error, wf.CorrelationID)
	}
	for _, st := range wf.Steps {
		fmt.Fprintf(w, "step\t%s %s %d ms %s\n", st.Step, st.State, st.DurationMS, st.Detail)
	}
}
