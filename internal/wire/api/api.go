// Package api owns the JSON wire contract shared by the control plane, the
// node agent and the operator CLI: request and response bodies, status and
// state enums, and the error envelope. It holds types and validation only; it
// must not import any other Drover package or do I/O.
package api

import (
	"encoding/json"
	"time"
)

// Header names used on every hop.
const (
	// HeaderCorrelationID carries the correlation id from the API through
	// tasks, agent logs, results and audit records.
	HeaderCorrelationID = "X-Correlation-ID"
	// HeaderPrefer is RFC 7240's request header; PreferMinimal asks for a
	// body-less answer where the route has one (the heartbeat: 204 with
	// HeaderHeartbeatInterval instead of a HeartbeatResponse body).
	HeaderPrefer  = "Prefer"
	PreferMinimal = "return=minimal"
	// HeaderHeartbeatInterval is the heartbeat interval of a minimal
	// heartbeat answer, as a Go duration ("5s").
	HeaderHeartbeatInterval = "Drover-Heartbeat-Interval"
)

// OS families a host may declare.
const (
	OSLinux     = "linux"
	OSDragonfly = "dragonflybsd"
	OSWindows   = "windows"
	OSDarwin    = "darwin"
)

// ValidOSFamily reports whether s is an accepted os_family.
func ValidOSFamily(s string) bool {
	switch s {
	case OSLinux, OSDragonfly, OSWindows, OSDarwin:
		return true
	}
	return false
}

// OSFamilyOf maps a GOOS to its os_family ("dragonfly" → "dragonflybsd");
// an unsupported GOOS is returned unchanged, which ValidOSFamily rejects.
func OSFamilyOf(goos string) string {
	if goos == "dragonfly" {
		return OSDragonfly
	}
	return goos
}

// HostStatus is a host's status as its agent is seen (docs/contract.md).
type HostStatus string

// Host statuses. A host is schedulable only when enabled and healthy.
const (
	HostHealthy          HostStatus = "healthy"
	HostStale            HostStatus = "stale"
	HostAuthFailed       HostStatus = "auth_failed"
	HostAPIUnreachable   HostStatus = "api_unreachable"
	HostTaskResultFailed HostStatus = "task_result_failed"
	HostUnknown          HostStatus = "unknown"
)

// TaskState is the lifecycle of a task.
type TaskState string

// Task states: queued → dispatched → running → succeeded | failed | expired | canceled.
const (
	TaskQueued     TaskState = "queued"
	TaskDispatched TaskState = "dispatched"
	TaskRunning    TaskState = "running"
	TaskSucceeded  TaskState = "succeeded"
	TaskFailed     TaskState = "failed"
	TaskExpired    TaskState = "expired"
	TaskCanceled   TaskState = "canceled"
)

// Terminal reports whether no further transition is possible.
func (s TaskState) Terminal() bool {
	switch s {
	case TaskSucceeded, TaskFailed, TaskExpired, TaskCanceled:
		return true
	}
	return false
}

// Capacity is a resource summary (also the agent's local GET /v1/capacity).
type Capacity struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
	DiskGiB   int `json:"disk_gib"`
	GPUs      int `json:"gpus"`
}

// CapacityReport is total, reserved, allocated and free capacity of a host.
type CapacityReport struct {
	Total     Capacity `json:"total"`
	Reserved  Capacity `json:"reserved"`
	Allocated Capacity `json:"allocated"`
	Free      Capacity `json:"free"`
}

// Capabilities is what an agent reports about its host at enrolment.
type Capabilities struct {
	Hostname      string   `json:"hostname"`
	OSFamily      string   `json:"os_family"`
	Arch          string   `json:"arch"`
	KernelVersion string   `json:"kernel_version,omitempty"`
	CPUCores      int      `json:"cpu_cores"`
	RAMTotalMB    int      `json:"ram_total_mb"`
	DiskTotalGB   int      `json:"disk_total_gb,omitempty"`
	GPUCount      int      `json:"gpu_count"`
	Accelerators  []string `json:"accelerators,omitempty"`
	SelectedAccel string   `json:"selected_accel,omitempty"`
	// AccelError is set when the selected accelerator does not work here:
	// "selected_accel not supported by host: kvm (...)". Such a host is not
	// schedulable.
	AccelError   string `json:"accel_error,omitempty"`
	AgentVersion string `json:"agent_version,omitempty"`
	// Runtimes are the instance runtimes this agent runs ("qemu",
	// "docker"); placement requires InstanceSpec.Runtime among them (an
	// agent reporting none runs VMs only). ContainerEngine and
	// ContainerEngineVersion name the engine behind "docker" ("docker",
	// "podman") and its version, as detected at start.
	Runtimes               []string `json:"runtimes,omitempty"`
	ContainerEngine        string   `json:"container_engine,omitempty"`
	ContainerEngineVersion string   `json:"container_engine_version,omitempty"`
	// ControlPlaneURL and TerminalURL are the node-facing URLs the agent
	// uses (NODE_AGENT_CONTROL_PLANE_URL, NODE_AGENT_TERMINAL_URL), compared
	// with the host's environment profile.
	ControlPlaneURL string `json:"control_plane_url,omitempty"`
	TerminalURL     string `json:"terminal_url,omitempty"`
	// Inventory is the full host inventory (CPU, NUMA, disks, NICs, GPUs,
	// fabric, NVMe, IOMMU groups).
	Inventory *HostInventory `json:"inventory,omitempty"`
	// LocalWorkloads are the inference servers the agent's flags declare
	// (-enable-vllm, -enable-ollama): the control plane keeps an instance
	// pinned to this host for each (docs/adr/0009-local-workloads.md).
	LocalWorkloads []PresetRequest `json:"local_workloads,omitempty"`
	// SliceNetwork is the slice network the agent serves; nil when it
	// serves none (NODE_AGENT_SLICE_CIDR unset).
	SliceNetwork *SliceNetwork `json:"slice_network,omitempty"`
}

// RegisterRequest enrols a host: POST /internal/v1/register (no client
// certificate). The credential is the bootstrap token or, for an agent
// whose certificate expired (ADR 0021), its previous certificate; exactly
// one of the two.
type RegisterRequest struct {
	HostID         string `json:"host_id"`
	BootstrapToken string `json:"bootstrap_token,omitempty"`
	// PreviousCertificate proves the agent holds the key of the host's
	// last certificate.
	PreviousCertificate *CertificateProof `json:"previous_certificate,omitempty"`
	CSRPEM              string            `json:"csr_pem"`
	Capabilities        Capabilities      `json:"capabilities"`
}

// CertificateProof is an agent's last certificate (expired or not) and
// its key's signature of the registration: host id, CSR and SignedAt
// (pki.SignReenrol).
type CertificateProof struct {
	CertificatePEM string    `json:"certificate_pem"`
	SignedAt       time.Time `json:"signed_at"`
	Signature      []byte    `json:"signature"`
}

// JWK is one public task-signing key.
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use,omitempty"`
}

// JWKS is a set of task-signing public keys; several are live during rotation.
type JWKS struct {
	Keys []JWK `json:"keys"`
}

// Identity is what enrolment and renewal return: the node id the control
// plane assigned, the client certificate, the CA bundle and the JWKS.
type Identity struct {
	NodeID            string    `json:"node_id"`
	CertificatePEM    string    `json:"certificate_pem"`
	CABundlePEM       string    `json:"ca_bundle_pem"`
	NotAfter          time.Time `json:"not_after"`
	JWKS              JWKS      `json:"jwks"`
	HeartbeatInterval Duration  `json:"heartbeat_interval"`
	TerminalURL       string    `json:"terminal_url,omitempty"`
}

// RenewRequest asks for a fresh certificate over mTLS:
// POST /internal/v1/nodes/{id}/renew.
type RenewRequest struct {
	CSRPEM string `json:"csr_pem"`
}

// Heartbeat is POST /internal/v1/nodes/{id}/heartbeat.
type Heartbeat struct {
	AgentVersion string          `json:"agent_version,omitempty"`
	Capacity     *CapacityReport `json:"capacity,omitempty"`
	// Diagnostic is an agent-side condition the operator should see, e.g.
	// "edge_rate_limited" or "task_result_post_failed". Empty when fine.
	Diagnostic string `json:"diagnostic,omitempty"`
	// DiagnosticDetail says what the agent saw (bounded), DiagnosticSince
	// when the condition began and CorrelationID the request it was seen
	// on; all empty when Diagnostic is.
	DiagnosticDetail string     `json:"diagnostic_detail,omitempty"`
	DiagnosticSince  *time.Time `json:"diagnostic_since,omitempty"`
	CorrelationID    string     `json:"correlation_id,omitempty"`
}

// HeartbeatResponse tells the agent the interval the server expects.
type HeartbeatResponse struct {
	HeartbeatInterval Duration `json:"heartbeat_interval"`
}

// TaskDelivery is the body of a 200 from GET .../tasks/wait. The agent trusts
// only what is inside Envelope; the outer fields must match the signed claims.
type TaskDelivery struct {
	TaskID        string    `json:"task_id"`
	TaskType      string    `json:"task_type"`
	Envelope      string    `json:"envelope"`
	ExpiresAt     time.Time `json:"expires_at"`
	CorrelationID string    `json:"correlation_id"`
	Attempt       int       `json:"attempt"`
	// More are the node's next tasks after this one, oldest first, each
	// claimed and signed like it: only for a wait that asked for more than
	// one (?max=N), never more than N-1, never with a More of their own.
	More []TaskDelivery `json:"more,omitempty"`
}

// MaxClaim is the most tasks one wait claims (?max=N is capped there).
const MaxClaim = 32

// TaskResults is the body of POST .../tasks/results: the results of
// several of the node's tasks in one request, each as POST
// .../tasks/{task_id}/result takes it. 1 to MaxResultBatch results, each
// task once; the request body is bounded as any other.
type TaskResults struct {
	Results []TaskResultFor `json:"results"`
}

// TaskResultFor is one result of TaskResults.
type TaskResultFor struct {
	TaskID string     `json:"task_id"`
	Result TaskResult `json:"result"`
}

// MaxResultBatch is the most results one POST .../tasks/results carries.
const MaxResultBatch = 64

// TaskClaims are the signed fields of a task envelope.
type TaskClaims struct {
	TaskID        string          `json:"task_id"`
	NodeID        string          `json:"aud"`
	Type          string          `json:"type"`
	Params        json.RawMessage `json:"params"`
	CorrelationID string          `json:"correlation_id"`
	IssuedAt      int64           `json:"iat"`
	ExpiresAt     int64           `json:"exp"`
}

// ResultStatus is the outcome an agent reports.
type ResultStatus string

// Result statuses.
const (
	ResultSucceeded ResultStatus = "succeeded"
	ResultFailed    ResultStatus = "failed"
)

// TaskResult is POST /internal/v1/nodes/{id}/tasks/{task_id}/result.
type TaskResult struct {
	Status ResultStatus    `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
	// Error is set when Status is failed.
	Error *ResultError `json:"error,omitempty"`
	// Timings holds phase durations, e.g. "timings.kernel_ms".
	Timings       map[string]int64 `json:"timings,omitempty"`
	CorrelationID string           `json:"correlation_id,omitempty"`
	FinishedAt    time.Time        `json:"finished_at"`
}

// ResultError is a structured task failure. Fields names the params (or
// other inputs) the failure concerns, when it names any (a refused device,
// an unsafe image); it is omitted otherwise, so a result without fields
// encodes as before. A control plane that decodes results strictly and
// predates Fields refuses one that carries them (422 invalid_json); the
// agent then posts it again without them (Message names them too).
type ResultError struct {
	Code    string       `json:"code"`
	Message string       `json:"message"`
	Fields  []FieldError `json:"fields,omitempty"`
}

// TaskEvent is POST /internal/v1/nodes/{id}/tasks/{task_id}/events: progress
// while a task runs. Phase "started" moves the task to running.
type TaskEvent struct {
	Phase      string         `json:"phase"`
	Status     string         `json:"status,omitempty"` // started | succeeded | failed
	DurationMS int64          `json:"duration_ms,omitempty"`
	Message    string         `json:"message,omitempty"`
	Data       map[string]any `json:"data,omitempty"`
	At         time.Time      `json:"at"`
}

// ErrorBody is the error envelope of every API: {"error": {...}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail names what failed. Fields lists field-level validation errors.
type ErrorDetail struct {
	Code          string       `json:"code"`
	Message       string       `json:"message"`
	Fields        []FieldError `json:"fields,omitempty"`
	CorrelationID string       `json:"correlation_id,omitempty"`
	Retryable     bool         `json:"retryable,omitempty"`
}

// FieldError is one invalid field, e.g. {"field":"ram_total_mb","message":"ram_total_mb >= 256"}.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Duration marshals as a Go duration string ("5s") and accepts either a
// string or a number of seconds.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return err
	}
	*d = Duration(time.Duration(secs * float64(time.Second)))
	return nil
}
