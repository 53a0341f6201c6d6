// Package accel owns the question "which QEMU accelerators really work on
// this host": it probes kvm, nvmm, hvf and tcg, proves KVM by running a
// minimal guest in a bounded child process (an existing /dev/kvm is not
// enough: on some hosts guests hang), caches the verdict in the agent's state
// directory per boot, and checks an operator's NODE_AGENT_QEMU_ACCEL
// selection against it (Select), refusing one the host cannot run with
// "selected_accel not supported by host".
//
// It does not launch VMs and knows nothing of the control plane: the agent
// reports the Result it gets from a Prober.
package accel

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Accelerator names, as QEMU's -accel spells them.
const (
	KVM  = "kvm"
	NVMM = "nvmm"
	HVF  = "hvf"
	TCG  = "tcg"
)

// Names returns every accelerator name this package knows, best first. It is
// also the preference order of Default.
func Names() []string { return []string{KVM, NVMM, HVF, TCG} }

// Reason codes: stable, machine-readable, snake_case. Detail carries the
// human-readable specifics.
const (
	ReasonOK            = "ok"             // it works
	ReasonNotApplicable = "not_applicable" // not an accelerator of this OS (or not probed here, e.g. whpx)
	ReasonNotProbed     = "not_probed"     // absent from the Result handed to Select

	ReasonQEMUMissing      = "qemu_missing"       // no qemu-system-<arch> on PATH
	ReasonQEMUFailed       = "qemu_failed"        // `qemu-system-<arch> -accel help` failed or timed out
	ReasonQEMUAccelMissing = "qemu_accel_missing" // the host supports it but this QEMU build does not list it

	ReasonKVMDeviceMissing   = "kvm_device_missing"   // no /dev/kvm
	ReasonKVMOpenFailed      = "kvm_open_failed"      // /dev/kvm cannot be opened read-write (permissions)
	ReasonKVMAPIMismatch     = "kvm_api_mismatch"     // KVM_GET_API_VERSION is not 12
	ReasonKVMSetupFailed     = "kvm_setup_failed"     // creating the VM, its memory or its vCPU failed
	ReasonKVMRunFailed       = "kvm_run_failed"       // KVM_RUN failed or the guest did not do what it must
	ReasonKVMGuestHung       = "kvm_guest_hung"       // the probe guest did not finish within the timeout
	ReasonKVMGuestTooSlow    = "kvm_guest_too_slow"   // the guest runs, but emulated, orders of magnitude below hardware speed
	ReasonKVMChildFailed     = "kvm_child_failed"     // the probe child process could not start or gave no verdict
	ReasonKVMUnsupportedArch = "kvm_unsupported_arch" // no probe guest for this CPU architecture

	ReasonNVMMDeviceMissing = "nvmm_device_missing" // no /dev/nvmm
	ReasonNVMMOpenFailed    = "nvmm_open_failed"    // /dev/nvmm cannot be opened read-write

	ReasonHVFUnsupported = "hvf_unsupported"  // sysctl kern.hv_support is not 1
	ReasonHVFProbeFailed = "hvf_probe_failed" // sysctl could not be read
)

// Status is the verdict on one accelerator.
type Status struct {
	Name       string `json:"name"`
	Works      bool   `json:"works"`
	Reason     string `json:"reason"` // ReasonOK when Works, else one of the other Reason* codes
	Detail     string `json:"detail,omitempty"`
	DurationMS int64  `json:"duration_ms"`
}

// Result is one probe of the host.
type Result struct {
	Accelerators []Status  `json:"accelerators"` // one per Names(), in that order
	Working      []string  `json:"working"`      // names that work, best first
	ProbedAt     time.Time `json:"probed_at"`
	BootID       string    `json:"boot_id,omitempty"` // linux boot id the verdict belongs to
	Cached       bool      `json:"cached,omitempty"`  // true when ProbeCached returned a stored verdict
}

// Status returns the verdict on name, if the Result has one.
func (r Result) Status(name string) (Status, bool) {
	for _, s := range r.Accelerators {
		if s.Name == name {
			return s, true
		}
	}
	return Status{}, false
}

// Default returns the best working accelerator (kvm > nvmm > hvf > tcg), or
// "" when none works.
func Default(res Result) string {
	for _, n := range Names() {
		if s, ok := res.Status(n); ok && s.Works {
			return n
		}
	}
	return ""
}

// UnknownError is Select's error for a name that is not an accelerator at
// all. Its text lists the valid names.
type UnknownError struct {
	Name string
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("unknown accelerator %q: valid values are %s", e.Name, strings.Join(Names(), ", "))
}

// UnsupportedMessage starts the text of every *UnsupportedError (a fixed
// wording; operators grep for it).
const UnsupportedMessage = "selected_accel not supported by host"

// UnsupportedError is Select's error for a known accelerator that this host
// cannot run.
type UnsupportedError struct {
	Name   string // the selected accelerator
	Reason string // the Status reason code
	Detail string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s: %s (%s: %s)", UnsupportedMessage, e.Name, e.Reason, e.Detail)
}

// Select checks an operator's selection (NODE_AGENT_QEMU_ACCEL) against a
// probe. "" selects nothing and is accepted. A name that is not an
// accelerator gives an *UnknownError; one that does not work here gives an
// *UnsupportedError, whose text starts with UnsupportedMessage.
func Select(res Result, selected string) error {
	if selected == "" {
		return nil
	}
	if !slices.Contains(Names(), selected) {
		return &UnknownError{Name: selected}
	}
	s, ok := res.Status(selected)
	if !ok {
		return &UnsupportedError{Name: selected, Reason: ReasonNotProbed, Detail: "the probe has no verdict on it"}
	}
	if !s.Works {
		return &UnsupportedError{Name: selected, Reason: s.Reason, Detail: s.Detail}
	}
	return nil
}
