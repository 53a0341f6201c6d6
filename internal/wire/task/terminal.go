package task

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Terminal task type: the gateway (internal/cp/server) creates it for a browser
// session; operators cannot enqueue it (Spec.Internal).
const (
	// TypeTerminalOpen asks a node to dial the gateway's node-facing
	// terminal stream for SessionID, presenting Nonce, and to start a PTY
	// (mode "pty"), attach to an instance's serial console (mode
	// "serial") or broker SSH into a slice VM (mode "vm_ssh"). The agent
	// reports success only once the stream is connected and the PTY
	// started; the session then outlives the task.
	TypeTerminalOpen = "terminal.open"
	// TerminalOpenTimeout bounds terminal.open on the agent: the dial plus
	// the PTY start, not the session.
	TerminalOpenTimeout = 30 * time.Second

	// TerminalModePTY starts a login shell as Username in a PTY.
	TerminalModePTY = "pty"
	// TerminalModeSerial attaches to instance InstanceID's serial console.
	TerminalModeSerial = "serial"
	// TerminalModeVMSSH is a brokered terminal into slice VM VMName: the
	// node dials the VM's own SSH address (recorded at provision, on the
	// node's loopback), authenticates with the VM's terminal key, checks
	// the guest's pinned host key and starts a PTY and shell as Username.
	TerminalModeVMSSH = "vm_ssh"

	// MaxTerminalCols and MaxTerminalRows bound the initial size (the same
	// bounds as internal/wire/terminal.Clamp).
	MaxTerminalCols = 1000
	MaxTerminalRows = 500
)

// TerminalOpenParams are the params of terminal.open.
type TerminalOpenParams struct {
	SessionID    string `json:"session_id"`
	AllocationID string `json:"allocation_id"`
	// Nonce is the per-session secret the node presents on the stream
	// (header X-Drover-Terminal-Nonce); 64 hex characters.
	Nonce      string `json:"nonce"`
	Mode       string `json:"mode"`
	Username   string `json:"username,omitempty"`    // mode pty
	InstanceID string `json:"instance_id,omitempty"` // mode serial
	// VMName is the slice VM of mode vm_ssh; the node refuses it unless
	// the VM was provisioned for AllocationID.
	VMName string `json:"vm_name,omitempty"`
	Cols   int    `json:"cols"`
	Rows   int    `json:"rows"`
	// MaxLifetime is the session's maximum lifetime; the node ends the
	// session after it even if the gateway is gone.
	MaxLifetime api.Duration `json:"max_lifetime"`
	// StreamURL is the node-facing base URL of the replica holding the
	// session, which the agent dials instead of its configured terminal URL
	// ("" : the configured one); see checkStreamURL.
	StreamURL string `json:"stream_url,omitempty"`
}

// DecodeTerminalOpenParams strictly decodes and validates the params of
// terminal.open; the server and the agent both use it.
func DecodeTerminalOpenParams(params json.RawMessage) (TerminalOpenParams, []api.FieldError) {
	var p TerminalOpenParams
	if fe := DecodeParams(params, &p); fe != nil {
		return TerminalOpenParams{}, fe
	}
	var v fieldErrs
	v.check("session_id", checkRequired(p.SessionID, checkToken))
	v.check("allocation_id", checkRequired(p.AllocationID, checkToken))
	v.check("nonce", checkRequired(p.Nonce, checkToken))
	switch p.Mode {
	case TerminalModePTY:
		v.check("username", checkRequired(p.Username, checkUsername))
		if p.InstanceID != "" {
			v.add("instance_id", "must be empty in mode pty")
		}
	case TerminalModeSerial:
		v.check("instance_id", checkRequired(p.InstanceID, checkToken))
	case TerminalModeVMSSH:
		v.check("username", checkRequired(p.Username, checkUsername))
		v.check("vm_name", checkRequired(p.VMName, checkToken))
		if p.InstanceID != "" {
			v.add("instance_id", "must be empty in mode vm_ssh")
		}
	default:
		v.add("mode", fmt.Sprintf("must be %q, %q or %q", TerminalModePTY, TerminalModeSerial, TerminalModeVMSSH))
	}
	if p.Mode != TerminalModeVMSSH && p.VMName != "" {
		v.add("vm_name", "only in mode vm_ssh")
	}
	if p.Cols < 1 || p.Cols > MaxTerminalCols {
		v.add("cols", fmt.Sprintf("must be 1-%d", MaxTerminalCols))
	}
	if p.Rows < 1 || p.Rows > MaxTerminalRows {
		v.add("rows", fmt.Sprintf("must be 1-%d", MaxTerminalRows))
	}
	if p.MaxLifetime <= 0 {
		v.add("max_lifetime", "must be positive")
	}
	v.check("stream_url", checkStreamURL(p.StreamURL))
	if v.fe != nil {
		return TerminalOpenParams{}, v.fe
	}
	return p, nil
}

func validateTerminalOpen(params json.RawMessage) []api.FieldError {
	_, fe := DecodeTerminalOpenParams(params)
	return fe
}
