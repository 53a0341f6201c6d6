package api

import (
	"encoding/json"
	"fmt"
	"net/url"
	"time"
)

// MaxProfileURLLen bounds an environment profile URL.
const MaxProfileURLLen = 512

// HostProfile is a host's environment profile: the node-facing control
// plane URL and terminal URL its agent is expected to use (set by the
// operator), beside the ones the agent reports in its capabilities. A
// mismatch is recorded as the host's last failure
// (terminal_env_profile_drift).
type HostProfile struct {
	APIURL              string `json:"api_url,omitempty"`
	TerminalURL         string `json:"terminal_url,omitempty"`
	ReportedAPIURL      string `json:"reported_api_url,omitempty"`
	ReportedTerminalURL string `json:"reported_terminal_url,omitempty"`
}

// HostProfileRequest is POST /api/v1/hosts/{id}/profile: both URLs are
// replaced; "" stops checking that URL.
type HostProfileRequest struct {
	APIURL      string `json:"api_url"`
	TerminalURL string `json:"terminal_url"`
}

// ValidProfileURL checks an environment profile URL: empty, or an absolute
// http(s) URL of bounded length.
func ValidProfileURL(field, s string) []FieldError {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	switch {
	case len(s) > MaxProfileURLLen:
		return []FieldError{{Field: field, Message: fmt.Sprintf("must be at most %d characters", MaxProfileURLLen)}}
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		return []FieldError{{Field: field, Message: "must be an absolute https:// URL"}}
	}
	return nil
}

// PreflightRun is a stored preflight report as the operator API shows it
// (GET /api/v1/preflight-runs/{id}); Report is the internal/wire/preflight
// Report as it was posted.
type PreflightRun struct {
	ID            string          `json:"id"`
	HostID        string          `json:"host_id,omitempty"`
	CorrelationID string          `json:"correlation_id"`
	OK            bool            `json:"ok"`
	FailedHop     string          `json:"failed_hop,omitempty"`
	Signal        string          `json:"signal,omitempty"`
	CreatedBy     string          `json:"created_by,omitempty"`
	CreatedAt     time.Time       `json:"created_at"`
	Report        json.RawMessage `json:"report,omitempty"`
}

// EvidenceFile is one file of an evidence bundle.
type EvidenceFile struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
}

// EvidenceManifest is manifest.json of an evidence bundle (GET
// /api/v1/evidence/{correlation_id}): the files, their sizes, the
// correlation id and what could not be collected, and why.
type EvidenceManifest struct {
	CorrelationID string            `json:"correlation_id"`
	CreatedAt     time.Time         `json:"created_at"`
	Files         []EvidenceFile    `json:"files"`
	Missing       map[string]string `json:"missing,omitempty"`
	// Truncated names the files cut to fit the bundle's bound.
	Truncated []string `json:"truncated,omitempty"`
}
