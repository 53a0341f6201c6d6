// Package cloudinit owns the cloud-init NoCloud seed the agent gives a VM:
// validating what goes into it, rendering user-data and meta-data, writing
// the seed directory, and packing it into an ISO9660 image labelled
// "cidata" (in Go, instead of cloud-localds).
//
// It must not start VMs, fetch images or read secrets from anywhere: the
// caller passes secret contents in Config.Files and owns where the seed
// lives and who may read it.
package cloudinit

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/drover-dev/drover/internal/node/atomicfile"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

// Defaults applied by UserData and MetaData.
const (
	DefaultUser        = "drover"
	DefaultReadyPrefix = "DROVER-READY " // + InstanceID
	DefaultReadyFile   = "/var/lib/drover/ready"
	// DefaultFileMode is a File's mode when Permissions is 0.
	DefaultFileMode os.FileMode = 0o600
)

// File is one write_files entry, owned by root.
type File struct {
	Path        string      // absolute guest path
	Content     []byte      // written as is (base64 in user-data)
	Permissions os.FileMode // permission bits, os.ModeSetuid/Setgid/Sticky; 0: DefaultFileMode
}

// Config is what the seed says about one guest.
type Config struct {
	// InstanceID is meta-data's instance-id (required; 1-128 of
	// [A-Za-z0-9._-]). A new id makes cloud-init run its per-instance
	// modules again.
	InstanceID string
	// Hostname is meta-data's local-hostname. Default: InstanceID with "_"
	// replaced by "-" (so a runtime id is a valid hostname).
	Hostname string
	// User is the default user, created with passwordless sudo, shell
	// /bin/bash and a locked password (default "drover").
	User string
	// SSHAuthorizedKeys are the user's keys, one authorized_keys line each.
	SSHAuthorizedKeys []string
	// ReadyMarker is printed on its own line to /dev/ttyS0 and
	// /dev/console by runcmd when cloud-init reaches its final stage;
	// default "DROVER-READY " + InstanceID.
	ReadyMarker string
	// ReadyFile is touched by runcmd just before the marker is printed;
	// default /var/lib/drover/ready.
	ReadyFile string
	// Files are written by write_files (e.g. secrets at
	// /run/drover/secrets/<name>, 0400).
	Files []File
}

var (
	instanceIDRE = pattern.Must(`^[A-Za-z0-9._-]{1,128}$`, `^[A-Za-z0-9._-]*$`, 1, 128)
	userRE       = pattern.Must(`^[a-z_][a-z0-9_-]{0,31}$`, `^[a-z_][a-z0-9_-]*$`, 1, 32)
	hostLabelRE  = pattern.Must(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`, `^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`, 1, 63)
)

func (c Config) hostname() string {
	if c.Hostname != "" {
		return c.Hostname
	}
	return strings.ReplaceAll(c.InstanceID, "_", "-")
}

func (c Config) user() string {
	if c.User != "" {
		return c.User
	}
	return DefaultUser
}

func (c Config) readyMarker() string {
	if c.ReadyMarker != "" {
		return c.ReadyMarker
	}
	return DefaultReadyPrefix + c.InstanceID
}

func (c Config) readyFile() string {
	if c.ReadyFile != "" {
		return c.ReadyFile
	}
	return DefaultReadyFile
}

// Validate checks every field and names the first bad one, e.g.
// `cloudinit: ssh_authorized_keys[1]: ...`.
func (c Config) Validate() error {
	if c.InstanceID == "" {
		return errors.New("cloudinit: instance_id: required")
	}
	if !instanceIDRE.MatchString(c.InstanceID) {
		return fmt.Errorf("cloudinit: instance_id %q: want 1-128 of [A-Za-z0-9._-]", c.InstanceID)
	}
	if err := validHostname(c.hostname()); err != nil {
		if c.Hostname == "" {
			return fmt.Errorf("cloudinit: hostname (default from instance_id) %q: %w", c.hostname(), err)
		}
		return fmt.Errorf("cloudinit: hostname %q: %w", c.Hostname, err)
	}
	if u := c.user(); !userRE.MatchString(u) || u == "root" {
		return fmt.Errorf("cloudinit: user %q: want 1-32 of [a-z0-9_-] starting with a letter or _, not root", u)
	}
	for i, k := range c.SSHAuthorizedKeys {
		if err := validKey(k); err != nil {
			return fmt.Errorf("cloudinit: ssh_authorized_keys[%d]: %w", i, err)
		}
	}
	if m := c.readyMarker(); hasControl(m) {
		return fmt.Errorf("cloudinit: ready_marker %q: control characters are not allowed", m)
	}
	if err := validGuestPath(c.readyFile()); err != nil {
		return fmt.Errorf("cloudinit: ready_file: %w", err)
	}
	seen := make(map[string]int, len(c.Files))
	for i, f := range c.Files {
		if err := validGuestPath(f.Path); err != nil {
			return fmt.Errorf("cloudinit: files[%d].path: %w", i, err)
		}
		if j, dup := seen[f.Path]; dup {
			return fmt.Errorf("cloudinit: files[%d].path %q: already written by files[%d]", i, f.Path, j)
		}
		seen[f.Path] = i
		if f.Permissions&^fileModeBits != 0 {
			return fmt.Errorf("cloudinit: files[%d].permissions %v: only permission, setuid, setgid and sticky bits are allowed", i, f.Permissions)
		}
	}
	return nil
}

func validHostname(h string) error {
	if len(h) > 253 {
		return errors.New("longer than 253 characters")
	}
	for _, l := range strings.Split(h, ".") {
		if !hostLabelRE.MatchString(l) {
			return fmt.Errorf("label %q: want 1-63 of [A-Za-z0-9-], not starting or ending with -", l)
		}
	}
	return nil
}

func validKey(k string) error {
	if strings.ContainsAny(strings.TrimSpace(k), "\r\n") {
		return errors.New("one key per entry, without line breaks")
	}
	if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
		return err
	} else if len(strings.TrimSpace(string(rest))) != 0 {
		return errors.New("one key per entry")
	}
	return nil
}

func validGuestPath(p string) error {
	switch {
	case p == "":
		return errors.New("required")
	case hasControl(p):
		return fmt.Errorf("%q: control characters are not allowed", p)
	case !strings.HasPrefix(p, "/") || p == "/":
		return fmt.Errorf("%q: want an absolute file path", p)
	case path.Clean(p) != p:
		return fmt.Errorf("%q: want a clean file path (no //, ., .. or trailing /)", p)
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// fileModeBits are the os.FileMode bits a File may carry.
const fileModeBits = os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky

// octalMode renders m the way chmod reads it, e.g. "0400", "04755".
func octalMode(m os.FileMode) string {
	v := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	return fmt.Sprintf("%#04o", v)
}

// userData is the #cloud-config document, emitted as JSON (valid YAML).
type userData struct {
	Hostname         string      `json:"hostname"`
	PreserveHostname bool        `json:"preserve_hostname"`
	Users            []userEntry `json:"users"`
	SSHPwauth        bool        `json:"ssh_pwauth"`
	DisableRoot      bool        `json:"disable_root"`
	WriteFiles       []writeFile `json:"write_files,omitempty"`
	Runcmd           [][]string  `json:"runcmd"`
}

type userEntry struct {
	Name              string   `json:"name"`
	Sudo              string   `json:"sudo"`
	Shell             string   `json:"shell"`
	LockPasswd        bool     `json:"lock_passwd"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
}

type writeFile struct {
	Path        string `json:"path"`
	Content     string `json:"content"`
	Encoding    string `json:"encoding"`
	Owner       string `json:"owner"`
	Permissions string `json:"permissions"`
}

// readyScript touches $2 and then prints $1 on each console that can be
// written; runcmd shell-quotes each argument, so neither needs escaping.
const readyScript = `mkdir -p "$(dirname "$2")" && touch "$2"; ` +
	`for t in /dev/ttyS0 /dev/console; do [ -w "$t" ] && printf '%s\n' "$1" >"$t" 2>/dev/null; done; true`

// UserData renders "#cloud-config\n" followed by the config as JSON (which
// cloud-init reads as YAML). It validates first.
func (c Config) UserData() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	keys := make([]string, len(c.SSHAuthorizedKeys))
	for i, k := range c.SSHAuthorizedKeys {
		keys[i] = strings.TrimSpace(k)
	}
	ud := userData{
		Hostname: c.hostname(),
		Users: []userEntry{{
			Name:              c.user(),
			Sudo:              "ALL=(ALL) NOPASSWD:ALL",
			Shell:             "/bin/bash",
			LockPasswd:        true,
			SSHAuthorizedKeys: keys,
		}},
		Runcmd: [][]string{{"sh", "-c", readyScript, "drover-ready", c.readyMarker(), c.readyFile()}},
	}
	ud.DisableRoot = true
	for _, f := range c.Files {
		mode := f.Permissions
		if mode == 0 {
			mode = DefaultFileMode
		}
		ud.WriteFiles = append(ud.WriteFiles, writeFile{
			Path:        f.Path,
			Content:     base64.StdEncoding.EncodeToString(f.Content),
			Encoding:    "b64",
			Owner:       "root:root",
			Permissions: octalMode(mode),
		})
	}
	b, err := json.MarshalIndent(ud, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cloudinit: encode user-data: %w", err)
	}
	return append(append([]byte("#cloud-config\n"), b...), '\n'), nil
}

// MetaData renders meta-data (instance-id and local-hostname) as JSON,
// which cloud-init reads as YAML. Call Validate first: MetaData does not.
func (c Config) MetaData() []byte {
	b, _ := json.MarshalIndent(struct {
		InstanceID    string `json:"instance-id"`
		LocalHostname string `json:"local-hostname"`
	}{c.InstanceID, c.hostname()}, "", "  ")
	return append(b, '\n')
}

// WriteSeedDir validates c and writes dir/user-data and dir/meta-data
// (0600, each replaced atomically) into dir, created 0700.
func WriteSeedDir(dir string, c Config) error {
	ud, err := c.UserData()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cloudinit: seed dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("cloudinit: seed dir: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"user-data", ud}, {"meta-data", c.MetaData()}} {
		if err := atomicfile.Write(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return fmt.Errorf("cloudinit: write %s: %w", f.name, err)
		}
	}
	return nil
}
