package task

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Built-in task types.
const (
	// TypeHealthProbe runs the agent's health probe (internal/node/diag).
	TypeHealthProbe = "diag.health_probe"
	// HealthProbeTimeout bounds diag.health_probe on the agent.
	HealthProbeTimeout = 30 * time.Second
	// MaxPathLen bounds path-valued params.
	MaxPathLen = 4096

	// TypeTopologyDiscover scans a host for GPU slice candidates
	// (internal/node/slice). It only reads; slots need operator approval.
	TypeTopologyDiscover = "slice.topology_discover"
	// TopologyDiscoverTimeout bounds slice.topology_discover on the agent.
	TopologyDiscoverTimeout = 60 * time.Second
	// DefaultOVSBridge is the slice bridge when ovs_bridge is not given.
	DefaultOVSBridge = "br-slice"
	// DefaultPrivateCIDR is the slice network when private_cidr is not given.
	DefaultPrivateCIDR = "10.77.0.0/24"
	// Bounds of private_cidr's prefix length: room for .10 + slot index, and
	// no larger than a /16.
	MinPrivatePrefixBits = 16
	MaxPrivatePrefixBits = 28
)

// HealthProbeParams are the params of diag.health_probe.
type HealthProbeParams struct {
	// DiagnosticPath is an optional absolute path on the node for the probe
	// to check; "" (the default) means none.
	DiagnosticPath string `json:"diagnostic_path,omitempty"`
}

// Builtin returns the specs of the task types known today (a fresh slice).
func Builtin() []Spec {
	return []Spec{
		{Type: TypeHealthProbe, Validate: validateHealthProbe, Timeout: HealthProbeTimeout,
			Meaning: "the agent's health probe", Params: HealthProbeParams{}},
		{Type: TypeTopologyDiscover, Validate: validateTopologyDiscover, Timeout: TopologyDiscoverTimeout,
			Meaning: "scan the host for GPU slice candidates (reads only)", Params: TopologyDiscoverParams{}},
		{Type: TypeVMProvision, Validate: validateVMProvision, Timeout: VMProvisionTimeout,
			Meaning: "provision a VM with its GPU slots passed through (the phases below)", Params: VMProvisionParams{}},
		{Type: TypeVMRelease, Validate: validateVMRelease, Timeout: VMReleaseTimeout,
			Meaning: "stop and remove a slice VM, rebind and optionally wipe its devices", Params: VMReleaseParams{}},
		{Type: TypeAllocProvisionUser, Validate: validateAllocProvisionUser, Timeout: AllocProvisionUserTimeout,
			Meaning: "create or update the allocation's OS user and its SSH keys", Params: AllocProvisionUserParams{}},
		{Type: TypeAllocDeprovisionUser, Validate: validateAllocDeprovisionUser, Timeout: AllocDeprovisionUserTimeout,
			Meaning: "remove the allocation's OS user", Params: AllocDeprovisionUserParams{}},
		{Type: TypeTerminalOpen, Validate: validateTerminalOpen, Timeout: TerminalOpenTimeout, Internal: true,
			Meaning: "open a terminal stream to the gateway (queued by the gateway)", Params: TerminalOpenParams{}},
		{Type: TypeLogsOpen, Validate: validateLogsOpen, Timeout: LogsOpenTimeout, Internal: true,
			Meaning: "stream an instance's logs to the control plane (queued by GET /api/v1/instances/{id}/logs)", Params: LogsOpenParams{}},
		EchoSpec(),
		CollectSpec(),
		PreflightSpec(),
		ImagePullSpec(),
		VolumeListSpec(),
		VolumeDeleteSpec(),
	}
}

func validateHealthProbe(params json.RawMessage) []api.FieldError {
	var p HealthProbeParams
	if fe := DecodeParams(params, &p); fe != nil {
		return fe
	}
	if p.DiagnosticPath != "" {
		if msg := checkAbsPath(p.DiagnosticPath); msg != "" {
			return []api.FieldError{{Field: "params.diagnostic_path", Message: msg}}
		}
	}
	return nil
}

// checkAbsPath validates a path that will be used on the node, whose OS the
// server does not assume: it accepts POSIX absolute paths ("/var/x"),
// Windows drive paths ("C:\x", "C:/x") and UNC paths ("\\host\share\x"). It
// rejects NUL bytes, control characters and ".." elements. It returns "" when
// the path is acceptable, else a message.
func checkAbsPath(p string) string {
	if len(p) > MaxPathLen {
		return "must be at most 4096 bytes"
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return "must not contain control characters"
		}
	}
	if !isAbsAnyOS(p) {
		return `must be an absolute path (e.g. "/var/lib/x" or "C:\data\x")`
	}
	for _, elem := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		if elem == ".." {
			return `must not contain ".." elements`
		}
	}
	return ""
}

func isAbsAnyOS(p string) bool {
	switch {
	case strings.HasPrefix(p, "/"):
		return true
	case strings.HasPrefix(p, `\\`) && len(p) > 2:
		return true // UNC
	case len(p) >= 3 && isLetter(p[0]) && p[1] == ':' && (p[2] == '\\' || p[2] == '/'):
		return true // drive letter
	}
	return false
}

func isLetter(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }

// TopologyDiscoverParams are the params of slice.topology_discover. Both
// are optional; WithDefaults fills them in.
type TopologyDiscoverParams struct {
	// OVSBridge is the Open vSwitch bridge slice VMs attach to.
	OVSBridge string `json:"ovs_bridge,omitempty"`
	// PrivateCIDR is the IPv4 network slot addresses come from
	// (.10 + slot index).
	PrivateCIDR string `json:"private_cidr,omitempty"`
}

// WithDefaults returns p with empty fields set to their defaults.
func (p TopologyDiscoverParams) WithDefaults() TopologyDiscoverParams {
	if p.OVSBridge == "" {
		p.OVSBridge = DefaultOVSBridge
	}
	if p.PrivateCIDR == "" {
		p.PrivateCIDR = DefaultPrivateCIDR
	}
	return p
}

// DecodeTopologyDiscoverParams strictly decodes and validates the params
// of slice.topology_discover; the server and the agent both use it. The
// result has defaults applied.
func DecodeTopologyDiscoverParams(params json.RawMessage) (TopologyDiscoverParams, []api.FieldError) {
	var p TopologyDiscoverParams
	if fe := DecodeParams(params, &p); fe != nil {
		return TopologyDiscoverParams{}, fe
	}
	var fe []api.FieldError
	if p.OVSBridge != "" {
		if msg := checkIfaceName(p.OVSBridge); msg != "" {
			fe = append(fe, api.FieldError{Field: "params.ovs_bridge", Message: msg})
		}
	}
	if p.PrivateCIDR != "" {
		if msg := checkPrivateCIDR(p.PrivateCIDR); msg != "" {
			fe = append(fe, api.FieldError{Field: "params.private_cidr", Message: msg})
		}
	}
	if fe != nil {
		return TopologyDiscoverParams{}, fe
	}
	return p.WithDefaults(), nil
}

func validateTopologyDiscover(params json.RawMessage) []api.FieldError {
	_, fe := DecodeTopologyDiscoverParams(params)
	return fe
}

// checkIfaceName accepts a Linux network interface name: 1-15 bytes of
// [A-Za-z0-9._-], not starting with "-" and not "." or "..".
func checkIfaceName(s string) string {
	const msg = "must be a network interface name: 1-15 characters of A-Z a-z 0-9 . _ -, not starting with -"
	if len(s) > 15 || s == "." || s == ".." || strings.HasPrefix(s, "-") {
		return msg
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLetter(c) && !(c >= '0' && c <= '9') && c != '.' && c != '_' && c != '-' {
			return msg
		}
	}
	return ""
}

// checkPrivateCIDR accepts an RFC 1918 IPv4 network address with a prefix
// length between MinPrivatePrefixBits and MaxPrivatePrefixBits.
func checkPrivateCIDR(s string) string {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil || !p.Addr().Is4():
		return `must be an IPv4 CIDR, e.g. "10.77.0.0/24"`
	case p.Bits() < MinPrivatePrefixBits || p.Bits() > MaxPrivatePrefixBits:
		return fmt.Sprintf("prefix length must be between /%d and /%d", MinPrivatePrefixBits, MaxPrivatePrefixBits)
	case p.Masked() != p:
		return fmt.Sprintf("must be a network address (%s)", p.Masked())
	case !p.Addr().IsPrivate():
		return "must be a private (RFC 1918) range: 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
	}
	return ""
}
