package api

import (
	"encoding/json"
	"time"
)

// SliceRequest is the slice part of CreateAllocationRequest: Slots > 0
// makes the allocation a slice allocation. The user (Username) and its SSH
// keys (SSHAuthorizedKeys) are created in the guest.
type SliceRequest struct {
	// Slots is how many approved slots the VM gets, all on one host.
	Slots int `json:"slots,omitempty"`
	// Image is the guest disk image (http, https or file URL) and
	// ImageSHA256 its digest.
	Image       string `json:"image,omitempty"`
	ImageSHA256 string `json:"image_sha256,omitempty"`
	// VCPUs and MemoryMiB are each slot's share of the VM (defaults 12 and
	// 65536, slice.vm_provision's).
	VCPUs     int `json:"vcpus,omitempty"`
	MemoryMiB int `json:"memory_mib,omitempty"`
	// WipeOnRelease zeroes the slots' NVMe namespaces when the allocation
	// is released; nil means true.
	WipeOnRelease *bool `json:"wipe_on_release,omitempty"`
	// Boot boots a kernel (and initrd) directly instead of the image's
	// own boot loader (slice.vm_provision's boot); nil boots the image.
	Boot *DirectBoot `json:"boot,omitempty"`
	// ReadinessMarker is the serial console line that means the guest is
	// ready (default slice.vm_provision's "DROVER-READY <vm_name>", which
	// the seed's cloud-init prints); ReadinessTimeoutSeconds bounds the
	// wait for it (default 600).
	ReadinessMarker         string `json:"readiness_marker,omitempty"`
	ReadinessTimeoutSeconds int    `json:"readiness_timeout_seconds,omitempty"`
}

// SliceWorkflow is a slice allocation's workflow as the API shows it.
type SliceWorkflow struct {
	// Status is provisioning, active, compensating, failed, releasing or
	// released.
	Status string `json:"status"`
	// Step is the step running or last run.
	Step   string `json:"step"`
	VMName string `json:"vm_name,omitempty"`
	// Slots are the leased slots, with the parameters sent to the node.
	Slots []SliceSlot `json:"slots,omitempty"`
	// NUMA says how the slots were placed: "node N" (one NUMA node),
	// "spanning" or "unknown".
	NUMA            string `json:"numa,omitempty"`
	ProvisionTaskID string `json:"provision_task_id,omitempty"`
	ReleaseTaskID   string `json:"release_task_id,omitempty"`
	// FailedStep, Signal (internal/wire/signal) and Error say why a failed
	// workflow failed; CorrelationID ties its tasks, audit and logs.
	FailedStep    string `json:"failed_step,omitempty"`
	Signal        string `json:"signal,omitempty"`
	Error         string `json:"error,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	// Steps are the recorded steps, in order.
	Steps []SliceWorkflowStep `json:"steps"`
	// Phases are slice.vm_provision's phases as the node reported them
	// (live while it runs).
	Phases []SlicePhase `json:"phases,omitempty"`
	// VM is the provisioned VM, once record_result ran.
	VM *SliceVM `json:"vm,omitempty"`
}

// SliceWorkflowStep is one recorded step.
type SliceWorkflowStep struct {
	Step string `json:"step"`
	// State is started, done, failed or skipped.
	State string `json:"state"`
	// IdempotencyKey is "<allocation id>/<step>": a step is recorded once,
	// before its side effect.
	IdempotencyKey string     `json:"idempotency_key"`
	TaskID         string     `json:"task_id,omitempty"`
	Detail         string     `json:"detail,omitempty"`
	StartedAt      time.Time  `json:"started_at"`
	EndedAt        *time.Time `json:"ended_at,omitempty"`
	DurationMS     int64      `json:"duration_ms"`
}

// SliceSlot is a leased slot and the parameters it was provisioned with.
type SliceSlot struct {
	SlotID       string `json:"slot_id"`
	SlotIndex    int    `json:"slot_index"`
	PCIAddress   string `json:"pci_address"`
	FabricDevice string `json:"fabric_device,omitempty"`
	NVMeDevice   string `json:"nvme_device,omitempty"`
	NUMANode     int    `json:"numa_node"`
	VCPUCount    int    `json:"vcpu_count"`
	MemoryMiB    int    `json:"memory_mib"`
	MACAddress   string `json:"mac_address"`
	PrivateIP    string `json:"private_ip"`
}

// SlicePhase is one phase of slice.vm_provision.
type SlicePhase struct {
	Phase      string `json:"phase"`
	Status     string `json:"status"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// SliceVM is what the workflow recorded of the provisioned VM (from
// slice.vm_provision's output).
type SliceVM struct {
	PrivateIP    string           `json:"private_ip,omitempty"`
	SSHHost      string           `json:"ssh_host,omitempty"`
	SSHPort      int              `json:"ssh_port,omitempty"`
	DefaultUser  string           `json:"default_user,omitempty"`
	Ready        bool             `json:"ready"`
	Readiness    json.RawMessage  `json:"readiness,omitempty"`
	Performance  json.RawMessage  `json:"performance,omitempty"`
	Timings      map[string]int64 `json:"timings,omitempty"`
	RawVNC       bool             `json:"raw_vnc"`
	ConsoleModel string           `json:"console_model,omitempty"`
}
