package task

// Decoding and field checks shared by the slice VM params (vm.go).

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/pattern"
)

// decodeNested strictly decodes one nested params object into dst; field
// errors are named "params.<field>.<name>".
func decodeNested(raw json.RawMessage, dst any, field string) []api.FieldError {
	if t := strings.TrimSpace(string(raw)); t == "" || t[0] != '{' {
		return []api.FieldError{{Field: "params." + field, Message: "must be a JSON object"}}
	}
	fe := DecodeParams(raw, dst)
	for i := range fe {
		fe[i].Field = "params." + field + strings.TrimPrefix(fe[i].Field, "params")
		if fe[i].Field == "params."+field && fe[i].Message == "params must be a JSON object" {
			fe[i].Message = "must be a JSON object"
		}
	}
	return fe
}

// unembed drops the embedded struct's name that encoding/json puts in the
// path of a type error ("params.VMReleaseParams.wipe" → "params.wipe").
func unembed(fe []api.FieldError, name string) []api.FieldError {
	for i := range fe {
		if rest, ok := strings.CutPrefix(fe[i].Field, "params."+name+"."); ok {
			fe[i].Field = "params." + rest
		}
	}
	return fe
}

// fieldErrs collects field errors on "params.<field>".
type fieldErrs struct{ fe []api.FieldError }

func (v *fieldErrs) add(field, msg string) {
	v.fe = append(v.fe, api.FieldError{Field: "params." + field, Message: msg})
}

// check adds msg unless it is "".
func (v *fieldErrs) check(field, msg string) {
	if msg != "" {
		v.add(field, msg)
	}
}

// checkRequired returns "is required" for "", else check(s).
func checkRequired(s string, check func(string) string) string {
	if s == "" {
		return "is required"
	}
	return check(s)
}

func checkVMName(s string) string {
	if s == "" {
		return "is required"
	}
	if !api.ValidRuntimeID(s) {
		return "must be 1-63 characters of a-z 0-9 _ -, starting with a letter or digit"
	}
	return ""
}

var (
	tokenRE    = pattern.Must(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`, `^[A-Za-z0-9][A-Za-z0-9._:-]*$`, 1, 128)
	usernameRE = pattern.Must(`^[a-z_][a-z0-9_-]{0,31}$`, `^[a-z_][a-z0-9_-]*$`, 1, 32)
	pciAddrRE  = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)
	sha256RE   = pattern.Must(`^[0-9a-fA-F]{64}$`, `^[0-9a-fA-F]*$`, 64, 64)
)

// checkToken accepts ids: 1-128 of [A-Za-z0-9._:-], starting with a letter
// or digit (safe as a file name).
func checkToken(s string) string {
	if !tokenRE.MatchString(s) {
		return "must be 1-128 characters of A-Z a-z 0-9 . _ : -, starting with a letter or digit"
	}
	return ""
}

// UsernameProblem says what is wrong with a Linux user name for an
// allocation ("" when it is acceptable); the server checks names the node
// never sees (instance console users) with it.
func UsernameProblem(s string) string { return checkUsername(s) }

func checkUsername(s string) string {
	if s == "root" {
		return "must not be root"
	}
	if !usernameRE.MatchString(s) {
		return "must be a Linux user name: 1-32 characters of a-z 0-9 _ -, starting with a letter or _"
	}
	return ""
}

func checkPCIAddr(s string) string {
	if !pciAddrRE.MatchString(s) {
		return `must be a PCI address in lowercase domain:bus:device.function form, e.g. "0000:3b:00.0"`
	}
	return ""
}

func checkSHA256(s string) string {
	if !sha256RE.MatchString(s) {
		return "must be a SHA-256 digest: 64 hex characters"
	}
	return ""
}

// checkArtifactURL accepts http, https and file URLs with a host (http) or
// an absolute path (file).
func checkArtifactURL(s string) string {
	if len(s) > MaxPathLen || hasControl(s) {
		return "must be at most 4096 printable characters"
	}
	u, err := url.Parse(s)
	if err != nil {
		return "must be a URL: " + err.Error()
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return "must name a host"
		}
	case "file":
		if msg := checkAbsPath(u.Path); msg != "" || u.Host != "" {
			return `must be file:///absolute/path`
		}
	default:
		return "must be an http, https or file URL"
	}
	return ""
}

func checkMAC(s string) string {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 || len(s) != 17 {
		return `must be a MAC address, e.g. "02:00:00:00:00:01"`
	}
	if hw[0]&1 == 1 {
		return "must be a unicast MAC address"
	}
	return ""
}

func checkSSHKey(s string) string {
	if len(s) > MaxSSHKeyLen {
		return fmt.Sprintf("must be at most %d bytes", MaxSSHKeyLen)
	}
	if strings.ContainsAny(s, "\r\n") {
		return "must be a single authorized_keys line"
	}
	if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(s)); err != nil || len(rest) > 0 {
		return `must be an SSH public key in authorized_keys form, e.g. "ssh-ed25519 AAAA... user@host"`
	}
	return ""
}

// checkOptRange accepts 0 (the default) or a value in [lo, hi].
func checkOptRange(n, lo, hi int) string {
	if n != 0 && (n < lo || n > hi) {
		return fmt.Sprintf("must be between %d and %d", lo, hi)
	}
	return ""
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}
