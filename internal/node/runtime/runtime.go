// Package runtime owns the Runtime port: the one interface through which
// the agent creates, starts, stops, destroys, inspects and re-adopts
// instances (VMs or containers), the instance Spec it takes, the Status and
// Events it gives back, and the typed Error that carries an instance reason
// code (docs/contract.md); and the Registry through which a binary names
// the adapters it links in (registry.go). Adapters live in sub-packages
// (qemu, mock; firecracker and docker later), each its own package; this
// one must not import any of them, nor do I/O.
//
// A Spec (spec.go) is shaped for any workload: an Image of a kind (a disk
// image by URL and SHA256, or an OCI image by reference and optional
// digest), Command/Args/Env, Ports (host forwards), Volumes, Devices (GPUs
// by index or UUID, PCI addresses for VFIO), Resources (vCPUs, memory,
// disk), Readiness (serial marker, TCP port, health-check cadence),
// Secrets and Owner. What only a VM has (direct kernel boot, a boot device,
// the accelerator, the cloud-init seed with its user and keys, the tap or
// user network device) is in Spec.VM. Each adapter validates what it
// supports and refuses the rest with an *Error naming the field
// (qemu: "spec.image.kind: oci images need a container or microVM
// runtime"); the wire's api.InstanceSpec is converted at the agent's
// boundary (reconcile.ToRuntimeSpec) and does not change.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Runtime runs instances on this host. Every method is safe for concurrent
// use; methods on different ids may run in parallel, and an adapter
// serialises calls on one id.
type Runtime interface {
	// Name is the adapter's name ("qemu", "mock").
	Name() string
	// Create prepares an instance without starting it: fetches and verifies
	// images, creates its disk overlay and cloud-init seed. Creating an id
	// that exists with the same spec is a no-op returning its status; with a
	// different spec it is an *Error wrapping ErrExists.
	Create(ctx context.Context, spec Spec) (Status, error)
	// Start boots a created or stopped instance and returns once the
	// process runs (not once the guest is ready: watch Events or Inspect).
	// Starting a running instance is a no-op.
	Start(ctx context.Context, id string) (Status, error)
	// Stop asks the guest to shut down and waits up to graceful; then it
	// kills it and reports HardStopped. Stopping a stopped instance is a
	// no-op.
	Stop(ctx context.Context, id string, graceful time.Duration) (StopResult, error)
	// Destroy kills the instance if it runs and removes everything Create
	// made (overlay, seed, sockets, state). Destroying an unknown id is a
	// no-op.
	Destroy(ctx context.Context, id string) error
	// Inspect returns an instance's status; an error wrapping ErrNotFound
	// for an unknown id.
	Inspect(ctx context.Context, id string) (Status, error)
	// List returns the status of every instance the runtime knows.
	List(ctx context.Context) ([]Status, error)
	// Recover re-adopts instances after an agent restart (running ones
	// keep running: no duplicates, no orphans) and returns them all. Call it
	// once at start, before anything else.
	Recover(ctx context.Context) ([]Status, error)
	// Probe is one health check of a running instance: the process is alive
	// and the guest runs, and, if the spec has a readiness TCP port, it
	// accepts connections. nil means healthy.
	Probe(ctx context.Context, id string) error
	// Subscribe delivers events until ctx ends (then the channel closes).
	// Delivery is best-effort: a slow subscriber may miss events, so
	// consumers also Inspect periodically.
	Subscribe(ctx context.Context) <-chan Event
}

// Sentinel errors; adapters wrap them.
var (
	ErrNotFound = errors.New("instance not found")
	ErrExists   = errors.New("instance exists with a different spec")
	// ErrSecretsNeeded: the instance's secrets were held only in the
	// agent's memory (never on its disk) and are gone (the agent
	// restarted); Create with the same spec and secrets gives them back,
	// then Start boots it. Adapters wrap it with secrets_injection_failed.
	ErrSecretsNeeded = errors.New("the instance's secrets are no longer in memory: create it again with them")
)

// Error is a runtime failure with the reason code the reconciler reports.
type Error struct {
	Reason api.ReasonCode
	Op     string // "create", "start", ...
	ID     string
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %s: %v", e.Op, e.ID, e.Reason, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error.
func Errorf(reason api.ReasonCode, op, id, format string, args ...any) *Error {
	return &Error{Reason: reason, Op: op, ID: id, Err: fmt.Errorf(format, args...)}
}

// ReasonOf returns the reason code carried by err, or fallback when err
// carries none.
func ReasonOf(err error, fallback api.ReasonCode) api.ReasonCode {
	var e *Error
	if errors.As(err, &e) && e.Reason != "" {
		return e.Reason
	}
	return fallback
}

// ValidID reports whether id may name an instance: 1-63 of [a-z0-9_-],
// starting with a letter or digit (api.ValidRuntimeID, shared with the task
// validators on the control plane side).
func ValidID(id string) bool { return api.ValidRuntimeID(id) }

// State is the process-level state of an instance.
type State string

// States.
const (
	StateCreated State = "created" // prepared, never started
	StateRunning State = "running"
	StateStopped State = "stopped" // shut down (by Stop or by the guest)
	StateCrashed State = "crashed" // exited without being asked to
)

// Status is an instance as the runtime sees it now.
type Status struct {
	ID        string    `json:"id"`
	Owner     string    `json:"owner,omitempty"`
	State     State     `json:"state"`
	Ready     bool      `json:"ready"` // the readiness condition has been met since the last start
	PID       int       `json:"pid,omitempty"`
	Accel     string    `json:"accel,omitempty"`
	StartedAt time.Time `json:"started_at,omitempty"`
	ExitedAt  time.Time `json:"exited_at,omitempty"`
	// ExitReason is set when State is stopped or crashed: a reason code
	// (oom_killed, ...) when the runtime knows one.
	ExitReason api.ReasonCode `json:"exit_reason,omitempty"`
	ExitDetail string         `json:"exit_detail,omitempty"`
	Ports      map[string]int `json:"ports,omitempty"` // forward name → host port
	// Adopted is true when Recover found the instance already running.
	Adopted bool `json:"adopted,omitempty"`
	// Paths the terminal gateway and operators use (empty in mock).
	SerialSocket string `json:"serial_socket,omitempty"`
	SerialLog    string `json:"serial_log,omitempty"`
	Overlay      string `json:"overlay,omitempty"`
	Spec         Spec   `json:"spec"`
}

// StopResult says how a stop went.
type StopResult struct {
	HardStopped bool          // the guest did not shut down in time and was killed
	Took        time.Duration // from the request to the process gone
}

// EventKind says what happened.
type EventKind string

// Event kinds.
const (
	EventStarted EventKind = "started"
	EventReady   EventKind = "ready"
	EventExited  EventKind = "exited" // see Status.State and ExitReason
	// EventProgress is a step of Create (an image pull's layers), for
	// logs and task phases; Detail says what.
	EventProgress EventKind = "progress"
)

// Event is one thing that happened to an instance.
type Event struct {
	ID     string
	Kind   EventKind
	At     time.Time
	State  State          // for EventExited: stopped or crashed
	Reason api.ReasonCode // for EventExited, when known
	Detail string
}
