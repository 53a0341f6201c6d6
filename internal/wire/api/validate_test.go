package api

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

const testCSR = "-----BEGIN CERTIFICATE REQUEST-----\nMIIBADCBpwIBADAXMRUwEwYDVQQDEwxkcm92ZXItYWdlbnQ=\n-----END CERTIFICATE REQUEST-----\n"

// testCertPEM is a PEM block of the right type (validation does not
// parse it).
const testCertPEM = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"

func validRegister() RegisterRequest {
	return RegisterRequest{
		HostID:         "node-01.rack_a",
		BootstrapToken: "tok-123",
		CSRPEM:         testCSR,
		Capabilities: Capabilities{
			Hostname:   "node-01",
			OSFamily:   OSLinux,
			Arch:       "amd64",
			CPUCores:   4,
			RAMTotalMB: 8192,
			GPUCount:   0,
		},
	}
}

func registerJSON(t *testing.T, r RegisterRequest) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestValidHostID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"0", true},
		{"node-01", true},
		{"node_01.rack-a", true},
		{strings.Repeat("a", 63), true},
		{"", false},
		{strings.Repeat("a", 64), false},
		{"-node", false},
		{".node", false},
		{"_node", false},
		{"Node", false},
		{"node/01", false},
		{"node 01", false},
		{"nöde", false},
		{"node\x00", false},
		{"node:1", false},
	}
	for _, tc := range tests {
		err := ValidHostID(tc.id)
		if (err == nil) != tc.ok {
			t.Errorf("ValidHostID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

func TestDecodeRegister(t *testing.T) {
	mod := func(f func(*RegisterRequest)) string {
		r := validRegister()
		f(&r)
		return registerJSON(t, r)
	}
	tests := []struct {
		name       string
		body       string
		wantErr    bool
		wantFields []FieldError // exact, in order
	}{
		{name: "valid", body: mod(func(*RegisterRequest) {})},
		{name: "valid all os families", body: mod(func(r *RegisterRequest) { r.Capabilities.OSFamily = OSDragonfly })},
		{name: "ram exactly 256", body: mod(func(r *RegisterRequest) { r.Capabilities.RAMTotalMB = 256 })},
		{name: "empty body", body: "", wantErr: true},
		{name: "syntax error", body: `{"host_id":`, wantErr: true},
		{name: "not an object", body: `[1,2]`, wantErr: true},
		{name: "wrong type", body: `{"host_id": 5}`, wantErr: true},
		{name: "unknown top-level field", body: `{"host_id":"a","extra":1}`, wantErr: true},
		{name: "unknown nested field", body: `{"capabilities":{"cpu_cores":1,"ram_mb":1}}`, wantErr: true},
		{name: "trailing data", body: mod(func(*RegisterRequest) {}) + `{}`, wantErr: true},
		{name: "trailing garbage", body: mod(func(*RegisterRequest) {}) + `x`, wantErr: true},
		{name: "trailing whitespace ok", body: mod(func(*RegisterRequest) {}) + "\n\t "},
		{
			name:       "ram too small (fixed wording)",
			body:       mod(func(r *RegisterRequest) { r.Capabilities.RAMTotalMB = 255 }),
			wantFields: []FieldError{{Field: "capabilities.ram_total_mb", Message: "ram_total_mb >= 256"}},
		},
		{
			name:       "missing host id",
			body:       mod(func(r *RegisterRequest) { r.HostID = "" }),
			wantFields: []FieldError{{Field: "host_id", Message: "host_id is required"}},
		},
		{
			name:       "uppercase host id",
			body:       mod(func(r *RegisterRequest) { r.HostID = "Node1" }),
			wantFields: []FieldError{{Field: "host_id", Message: "host_id must match [a-z0-9][a-z0-9-._]*"}},
		},
		{
			name:       "host id too long",
			body:       mod(func(r *RegisterRequest) { r.HostID = strings.Repeat("x", 64) }),
			wantFields: []FieldError{{Field: "host_id", Message: "host_id must be at most 63 characters"}},
		},
		{
			name:       "missing token",
			body:       mod(func(r *RegisterRequest) { r.BootstrapToken = "" }),
			wantFields: []FieldError{{Field: "bootstrap_token", Message: "bootstrap_token is required"}},
		},
		{
			name: "previous certificate instead of a token",
			body: mod(func(r *RegisterRequest) {
				r.BootstrapToken = ""
				r.PreviousCertificate = &CertificateProof{CertificatePEM: testCertPEM, SignedAt: time.Unix(1, 0), Signature: []byte{1}}
			}),
		},
		{
			name: "previous certificate and a token",
			body: mod(func(r *RegisterRequest) {
				r.PreviousCertificate = &CertificateProof{CertificatePEM: testCertPEM, SignedAt: time.Unix(1, 0), Signature: []byte{1}}
			}),
			wantFields: []FieldError{{Field: "previous_certificate", Message: "give bootstrap_token or previous_certificate, not both"}},
		},
		{
			name: "empty previous certificate",
			body: mod(func(r *RegisterRequest) {
				r.BootstrapToken = ""
				r.PreviousCertificate = &CertificateProof{Signature: make([]byte, 513)}
			}),
			wantFields: []FieldError{
				{Field: "previous_certificate.certificate_pem", Message: `certificate_pem must contain a PEM "CERTIFICATE" block`},
				{Field: "previous_certificate.signed_at", Message: "signed_at is required"},
				{Field: "previous_certificate.signature", Message: "signature is required, at most 512 bytes"},
			},
		},
		{
			name:       "missing csr",
			body:       mod(func(r *RegisterRequest) { r.CSRPEM = "" }),
			wantFields: []FieldError{{Field: "csr_pem", Message: "csr_pem is required"}},
		},
		{
			name:       "csr not pem",
			body:       mod(func(r *RegisterRequest) { r.CSRPEM = "hello" }),
			wantFields: []FieldError{{Field: "csr_pem", Message: `csr_pem must contain a PEM "CERTIFICATE REQUEST" block`}},
		},
		{
			name: "csr wrong pem type",
			body: mod(func(r *RegisterRequest) {
				r.CSRPEM = strings.ReplaceAll(testCSR, "CERTIFICATE REQUEST", "CERTIFICATE")
			}),
			wantFields: []FieldError{{Field: "csr_pem", Message: `csr_pem must contain a PEM "CERTIFICATE REQUEST" block`}},
		},
		{
			name: "csr after another block",
			body: mod(func(r *RegisterRequest) {
				r.CSRPEM = strings.ReplaceAll(testCSR, "CERTIFICATE REQUEST", "CERTIFICATE") + testCSR
			}),
		},
		{
			name:       "bad os family",
			body:       mod(func(r *RegisterRequest) { r.Capabilities.OSFamily = "plan9" }),
			wantFields: []FieldError{{Field: "capabilities.os_family", Message: "os_family must be one of linux, dragonflybsd, windows, darwin"}},
		},
		{
			name:       "zero cpus",
			body:       mod(func(r *RegisterRequest) { r.Capabilities.CPUCores = 0 }),
			wantFields: []FieldError{{Field: "capabilities.cpu_cores", Message: "cpu_cores >= 1"}},
		},
		{
			name:       "negative gpus",
			body:       mod(func(r *RegisterRequest) { r.Capabilities.GPUCount = -1 }),
			wantFields: []FieldError{{Field: "capabilities.gpu_count", Message: "gpu_count >= 0"}},
		},
		{
			name:       "long hostname",
			body:       mod(func(r *RegisterRequest) { r.Capabilities.Hostname = strings.Repeat("h", 256) }),
			wantFields: []FieldError{{Field: "capabilities.hostname", Message: "hostname must be at most 255 characters"}},
		},
		{
			name: "several errors at once",
			body: `{"host_id":"","bootstrap_token":"","csr_pem":"","capabilities":{}}`,
			wantFields: []FieldError{
				{Field: "host_id", Message: "host_id is required"},
				{Field: "bootstrap_token", Message: "bootstrap_token is required"},
				{Field: "csr_pem", Message: "csr_pem is required"},
				{Field: "capabilities.os_family", Message: "os_family must be one of linux, dragonflybsd, windows, darwin"},
				{Field: "capabilities.cpu_cores", Message: "cpu_cores >= 1"},
				{Field: "capabilities.ram_total_mb", Message: "ram_total_mb >= 256"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, fe, err := DecodeRegister(strings.NewReader(tc.body))
			if tc.wantErr {
				if err == nil || !errors.Is(err, ErrInvalidJSON) {
					t.Fatalf("err = %v, want ErrInvalidJSON", err)
				}
				if fe != nil {
					t.Fatalf("fieldErrs = %v alongside err", fe)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected err: %v", err)
			}
			if len(fe) != len(tc.wantFields) {
				t.Fatalf("fieldErrs = %+v, want %+v", fe, tc.wantFields)
			}
			for i := range fe {
				if fe[i] != tc.wantFields[i] {
					t.Errorf("fieldErrs[%d] = %+v, want %+v", i, fe[i], tc.wantFields[i])
				}
			}
			if len(fe) == 0 && req.HostID == "" {
				t.Fatal("valid request decoded with empty host_id")
			}
		})
	}
}

func TestCapabilitiesValidatePrefix(t *testing.T) {
	c := validRegister().Capabilities
	c.RAMTotalMB = 1
	fe := c.Validate("")
	if len(fe) != 1 || fe[0].Field != "ram_total_mb" || fe[0].Message != "ram_total_mb >= 256" {
		t.Fatalf("Validate(\"\") = %+v", fe)
	}
	fe = c.Validate("host.capabilities")
	if len(fe) != 1 || fe[0].Field != "host.capabilities.ram_total_mb" {
		t.Fatalf("Validate(prefix) = %+v", fe)
	}
}

// FuzzDecodeRegister checks that decoding never panics and that every request
// it accepts satisfies the rules, checked here independently.
func FuzzDecodeRegister(f *testing.F) {
	v := validRegister()
	b, _ := json.Marshal(v)
	f.Add(string(b))
	f.Add(`{}`)
	f.Add(`null`)
	f.Add(`{"host_id":"a","bootstrap_token":"t","csr_pem":"` + strings.ReplaceAll(testCSR, "\n", `\n`) +
		`","capabilities":{"os_family":"windows","cpu_cores":1,"ram_total_mb":256,"gpu_count":0}}`)
	f.Add(`{"host_id":"A"}`)
	f.Add(`{"capabilities":{"ram_total_mb":1e400}}`)
	f.Fuzz(func(t *testing.T, body string) {
		req, fe, err := DecodeRegister(strings.NewReader(body))
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) || fe != nil {
				t.Fatalf("err=%v fe=%v", err, fe)
			}
			return
		}
		if len(fe) > 0 {
			for _, e := range fe {
				if e.Field == "" || e.Message == "" {
					t.Fatalf("empty field error %+v", e)
				}
			}
			return
		}
		// Accepted: every rule must hold.
		id := req.HostID
		if len(id) < 1 || len(id) > 63 {
			t.Fatalf("accepted host_id length %d", len(id))
		}
		for i, c := range []byte(id) {
			lowerOrDigit := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
			if !lowerOrDigit && (i == 0 || !strings.ContainsRune("-._", rune(c))) {
				t.Fatalf("accepted host_id %q", id)
			}
		}
		if req.BootstrapToken == "" {
			t.Fatal("accepted empty bootstrap_token")
		}
		if !strings.Contains(req.CSRPEM, "-----BEGIN CERTIFICATE REQUEST-----") {
			t.Fatalf("accepted csr_pem %q", req.CSRPEM)
		}
		c := req.Capabilities
		if !ValidOSFamily(c.OSFamily) || c.CPUCores < 1 || c.RAMTotalMB < 256 || c.GPUCount < 0 ||
			c.DiskTotalGB < 0 || len(c.Hostname) > 255 {
			t.Fatalf("accepted capabilities %+v", c)
		}
		// Round trip: re-encoding and decoding again is still valid.
		again, _ := json.Marshal(req)
		if _, fe2, err2 := DecodeRegister(strings.NewReader(string(again))); err2 != nil || len(fe2) > 0 {
			t.Fatalf("round trip failed: %v %v", err2, fe2)
		}
	})
}
