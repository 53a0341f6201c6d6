package task

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/api"
)

// Built-in task types.
const (
	// TypeHealthProbe runs the agent's health probe (internal/diag).
	TypeHealthProbe = "diag.health_probe"
	// HealthProbeTimeout bounds diag.health_probe on the agent.
	HealthProbeTimeout = 30 * time.Second
	// MaxPathLen bounds path-valued params.
	MaxPathLen = 4096
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
		{Type: TypeHealthProbe, Validate: validateHealthProbe, Timeout: HealthProbeTimeout},
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
