package api

import (
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Limits enforced by the validators below.
const (
	// MaxHostIDLen is the longest accepted host id (a DNS label).
	MaxHostIDLen = 63
	// MaxHostnameLen is the longest accepted capabilities.hostname.
	MaxHostnameLen = 255
	// MaxBootstrapTokenLen bounds the bootstrap token field.
	MaxBootstrapTokenLen = 1024
	// MinRAMTotalMB is the smallest ram_total_mb a host may declare.
	MinRAMTotalMB = 256
)

// ErrInvalidJSON marks a body that is not a well-formed JSON document of the
// expected shape (syntax error, wrong type, unknown field, trailing data).
// Callers map it to error code "invalid_json".
var ErrInvalidJSON = errors.New("invalid_json")

// ValidHostID reports whether s is an acceptable host id: 1–63 characters,
// starting with [a-z0-9] and continuing with [a-z0-9-._]. Host ids are node
// ids, appear in URL paths and in certificate URI SANs, so the alphabet is
// deliberately narrow.
func ValidHostID(s string) error {
	if s == "" {
		return errors.New("host_id is required")
	}
	if len(s) > MaxHostIDLen {
		return fmt.Errorf("host_id must be at most %d characters", MaxHostIDLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '-' || c == '.' || c == '_'):
		default:
			return errors.New("host_id must match [a-z0-9][a-z0-9-._]*")
		}
	}
	return nil
}

// DecodeRegister decodes a RegisterRequest strictly (unknown fields and
// trailing data rejected; the caller bounds the size, e.g. with
// http.MaxBytesReader) and validates it. err (wrapping ErrInvalidJSON) means
// the body is malformed; fieldErrs lists semantic problems. Exactly one of
// them is non-nil when the request is unacceptable.
func DecodeRegister(r io.Reader) (RegisterRequest, []FieldError, error) {
	var req RegisterRequest
	if err := DecodeStrict(r, &req); err != nil {
		return RegisterRequest{}, nil, err
	}
	if fe := req.Validate(); len(fe) > 0 {
		return req, fe, nil
	}
	return req, nil, nil
}

// DecodeStrict decodes exactly one JSON value from r into dst, rejecting
// unknown object fields and anything after the value. Errors wrap
// ErrInvalidJSON.
func DecodeStrict(r io.Reader, dst any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: empty body", ErrInvalidJSON)
		}
		return fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: unexpected data after JSON value", ErrInvalidJSON)
	}
	return nil
}

// maxProofSignature bounds a CertificateProof's signature (an ECDSA P-384
// signature is at most 104 bytes, Ed25519's 64).
const maxProofSignature = 512

// Validate checks a decoded RegisterRequest; nil means valid.
func (r RegisterRequest) Validate() []FieldError {
	var fe []FieldError
	if err := ValidHostID(r.HostID); err != nil {
		fe = append(fe, FieldError{Field: "host_id", Message: err.Error()})
	}
	switch p := r.PreviousCertificate; {
	case p != nil && r.BootstrapToken != "":
		fe = append(fe, FieldError{Field: "previous_certificate", Message: "give bootstrap_token or previous_certificate, not both"})
	case p != nil:
		if !HasPEMBlock(p.CertificatePEM, "CERTIFICATE") {
			fe = append(fe, FieldError{Field: "previous_certificate.certificate_pem",
				Message: `certificate_pem must contain a PEM "CERTIFICATE" block`})
		}
		if p.SignedAt.IsZero() {
			fe = append(fe, FieldError{Field: "previous_certificate.signed_at", Message: "signed_at is required"})
		}
		if len(p.Signature) == 0 || len(p.Signature) > maxProofSignature {
			fe = append(fe, FieldError{Field: "previous_certificate.signature",
				Message: fmt.Sprintf("signature is required, at most %d bytes", maxProofSignature)})
		}
	case r.BootstrapToken == "":
		fe = append(fe, FieldError{Field: "bootstrap_token", Message: "bootstrap_token is required"})
	case len(r.BootstrapToken) > MaxBootstrapTokenLen:
		fe = append(fe, FieldError{Field: "bootstrap_token",
			Message: fmt.Sprintf("bootstrap_token must be at most %d characters", MaxBootstrapTokenLen)})
	}
	switch {
	case r.CSRPEM == "":
		fe = append(fe, FieldError{Field: "csr_pem", Message: "csr_pem is required"})
	case !HasPEMBlock(r.CSRPEM, "CERTIFICATE REQUEST"):
		fe = append(fe, FieldError{Field: "csr_pem", Message: `csr_pem must contain a PEM "CERTIFICATE REQUEST" block`})
	}
	fe = append(fe, r.Capabilities.Validate("capabilities")...)
	return fe
}

// Validate checks the capabilities an agent reports. prefix names the
// enclosing field ("capabilities"); field errors are "<prefix>.<name>", or
// just "<name>" when prefix is empty. Messages keep a fixed wording, e.g.
// "ram_total_mb >= 256".
func (c Capabilities) Validate(prefix string) []FieldError {
	field := func(name string) string {
		if prefix == "" {
			return name
		}
		return prefix + "." + name
	}
	var fe []FieldError
	if len(c.Hostname) > MaxHostnameLen {
		fe = append(fe, FieldError{Field: field("hostname"),
			Message: fmt.Sprintf("hostname must be at most %d characters", MaxHostnameLen)})
	}
	if !ValidOSFamily(c.OSFamily) {
		fe = append(fe, FieldError{Field: field("os_family"),
			Message: "os_family must be one of " + strings.Join([]string{OSLinux, OSDragonfly, OSWindows, OSDarwin}, ", ")})
	}
	if c.CPUCores < 1 {
		fe = append(fe, FieldError{Field: field("cpu_cores"), Message: "cpu_cores >= 1"})
	}
	if c.RAMTotalMB < MinRAMTotalMB {
		fe = append(fe, FieldError{Field: field("ram_total_mb"), Message: fmt.Sprintf("ram_total_mb >= %d", MinRAMTotalMB)})
	}
	if c.DiskTotalGB < 0 {
		fe = append(fe, FieldError{Field: field("disk_total_gb"), Message: "disk_total_gb >= 0"})
	}
	if c.GPUCount < 0 {
		fe = append(fe, FieldError{Field: field("gpu_count"), Message: "gpu_count >= 0"})
	}
	return fe
}

// HasPEMBlock reports whether s contains at least one PEM block of the given
// type (e.g. "CERTIFICATE REQUEST"). It does not parse the block's contents.
func HasPEMBlock(s, blockType string) bool {
	rest := []byte(s)
	for len(rest) > 0 {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return false
		}
		if b.Type == blockType {
			return true
		}
	}
	return false
}
