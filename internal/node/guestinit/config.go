// Package guestinit is Drover's init for microVMs: a static Go binary
// (cmd/drover-init) that runs as PID 1 in the guest. Booted from an
// initramfs that also holds the kernel's virtio and ext4 modules
// (BuildInitramfs), it loads them, finds its config drive and the root
// disk by their virtio serials (or where the kernel command line names
// them, for VMMs without serials: DisksFromCmdline), switches into the
// image's root
// filesystem, and runs the image's entrypoint with the image config's
// user, environment and working directory; secrets go to a tmpfs. It
// reports on the serial console, one "DROVER-INIT {json}" line per event
// (Report), forwards the ACPI power button and SIGTERM/SIGINT to the
// workload as SIGTERM, and powers the VM off when the workload exits.
//
// This file holds the parts the host shares with the guest (the config
// drive's format, the report lines, user lookup), so the agent and the
// tests use them on any OS; the PID 1 side is init_linux.go.
package guestinit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Virtio serials of the disks the runtime attaches; the init finds them
// under /sys/block/vd*/serial (virtio-mmio probes devices in no fixed
// order, so names like vda are not relied on unless the kernel command
// line names them: RootParam, ConfigParam).
const (
	RootSerial   = "drover-root"
	ConfigSerial = "drover-config"
)

// SecretsDir is where secrets appear in the guest: a tmpfs, one file
// (0400) per secret.
const SecretsDir = "/run/drover/secrets"

// configMagic starts a config drive: the magic, the JSON's length in
// decimal and a newline, then the JSON, padded with zeros to whole
// sectors. A raw format needs no filesystem driver and no mkfs tool.
const configMagic = "DROVER-CONFIG/1 "

// maxConfig bounds the JSON of a config drive.
const maxConfig = 16 << 20

// Config is what the init needs from the host: the image config
// (entrypoint, cmd, env, user, working directory), the instance's
// hostname, secrets, volumes and network address.
type Config struct {
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// Env is KEY=VALUE, the image's then the spec's (later wins).
	Env []string `json:"env,omitempty"`
	// User is the image config's user: "", a name, "uid", "name:group",
	// "uid:gid" (looked up in the root filesystem's /etc/passwd and
	// /etc/group).
	User       string            `json:"user,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	Hostname   string            `json:"hostname,omitempty"`
	Secrets    map[string][]byte `json:"secrets,omitempty"`
	Volumes    []Volume          `json:"volumes,omitempty"`
	Network    *Network          `json:"network,omitempty"`
}

// VolumeErrorPrefix starts the init's error when it cannot mount a volume
// (reported as a failed event: the host maps it to volume_attach_failed).
const VolumeErrorPrefix = "volume "

// Volume is a disk (found by its virtio serial) mounted at Target.
type Volume struct {
	Serial   string `json:"serial"`
	Target   string `json:"target"`
	FSType   string `json:"fstype,omitempty"` // default ext4
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Network configures the first ethernet interface statically.
type Network struct {
	Address string `json:"address"`           // CIDR, e.g. 10.0.2.15/24
	Gateway string `json:"gateway,omitempty"` // default route
	DNS     string `json:"dns,omitempty"`     // resolvers, comma-separated: ResolvConf
}

// ResolvConf is the /etc/resolv.conf of n: a nameserver line per
// resolver in DNS, nil when there is none.
func (n Network) ResolvConf() []byte {
	var b bytes.Buffer
	for _, d := range strings.Split(n.DNS, ",") {
		if d = strings.TrimSpace(d); d != "" {
			b.WriteString("nameserver " + d + "\n")
		}
	}
	return b.Bytes()
}

// UserNetwork is QEMU user-mode networking's guest side.
var UserNetwork = Network{Address: "10.0.2.15/24", Gateway: "10.0.2.2", DNS: "10.0.2.3"}

// Argv is the command the init runs: entrypoint then cmd.
func (c Config) Argv() []string { return append(append([]string(nil), c.Entrypoint...), c.Cmd...) }

// Validate checks what the init cannot work without.
func (c Config) Validate() error {
	if len(c.Argv()) == 0 {
		return errors.New("no entrypoint or cmd")
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("env %q: want KEY=VALUE", e)
		}
	}
	if c.WorkingDir != "" && !path.IsAbs(c.WorkingDir) {
		return fmt.Errorf("working_dir %q is not absolute", c.WorkingDir)
	}
	for n := range c.Secrets {
		if n == "" || strings.ContainsAny(n, "/\x00") || n == "." || n == ".." {
			return fmt.Errorf("secret name %q", n)
		}
	}
	for i, v := range c.Volumes {
		if v.Serial == "" || !path.IsAbs(v.Target) || path.Clean(v.Target) == "/" {
			return fmt.Errorf("volumes[%d]: want a serial and an absolute target other than /", i)
		}
	}
	return nil
}

// EncodeConfig returns a config drive's bytes.
func EncodeConfig(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	js, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s%d\n", configMagic, len(js))
	b.Write(js)
	if r := b.Len() % 4096; r != 0 {
		b.Write(make([]byte, 4096-r))
	}
	return b.Bytes(), nil
}

// DecodeConfig reads a config drive.
func DecodeConfig(r io.Reader) (Config, error) {
	var c Config
	br := bufio.NewReader(r)
	head, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, configMagic) {
		return c, errors.New("config drive: no " + strings.TrimSpace(configMagic) + " header")
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, configMagic)))
	if err != nil || n <= 0 || n > maxConfig {
		return c, fmt.Errorf("config drive: bad length in header %q", strings.TrimSpace(head))
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(br, js); err != nil {
		return c, fmt.Errorf("config drive: %w", err)
	}
	if err := json.Unmarshal(js, &c); err != nil {
		return c, fmt.Errorf("config drive: %w", err)
	}
	return c, c.Validate()
}

// Workload is the guest config of a workload: image (the entrypoint, cmd,
// env, user and working directory of an OCI image's config; zero for a
// bare root filesystem) with an instance's overrides, as Docker applies
// them: command replaces the entrypoint and resets the cmd, args replace
// the cmd, env entries are merged over the image's (MergeEnv). The caller
// sets the rest (hostname, secrets, network, volumes).
func Workload(image Config, command, args []string, env map[string]string) Config {
	cfg := image
	if len(command) > 0 {
		cfg.Entrypoint, cfg.Cmd = command, nil
	}
	if len(args) > 0 {
		cfg.Cmd = args
	}
	cfg.Env = MergeEnv(cfg.Env, env)
	return cfg
}

// MergeEnv overlays extra (KEY=VALUE) on base; keys keep their first
// position, sorted extra keys follow.
func MergeEnv(base []string, extra map[string]string) []string {
	out := append([]string(nil), base...)
	idx := map[string]int{}
	for i, e := range out {
		k, _, _ := strings.Cut(e, "=")
		idx[k] = i
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kv := k + "=" + extra[k]
		if i, ok := idx[k]; ok {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}

// ReportPrefix starts every report line on the serial console.
const ReportPrefix = "DROVER-INIT "

// Report events.
const (
	EventStarted = "started" // the workload runs (PID)
	EventExited  = "exited"  // the workload ended (ExitCode, Signal, OOMKilled)
	EventFailed  = "failed"  // the init could not start the workload (Error)
)

// Report is one line the init writes on the serial console.
type Report struct {
	Event     string `json:"event"`
	PID       int    `json:"pid,omitempty"`
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	Error     string `json:"error,omitempty"`
	// UptimeMS is the guest's uptime when the event happened (boot-time
	// breakdowns).
	UptimeMS int64 `json:"uptime_ms,omitempty"`
}

// Line is the report as written: prefix, JSON, CRLF.
func (r Report) Line() string {
	b, _ := json.Marshal(r)
	return ReportPrefix + string(b) + "\r\n"
}

// ParseReports returns the reports found in serial output, in order.
// Text before the prefix on the same line (interleaved workload output)
// is ignored.
func ParseReports(serial []byte) []Report {
	var out []Report
	for _, line := range bytes.Split(serial, []byte("\n")) {
		i := bytes.Index(line, []byte(ReportPrefix))
		if i < 0 {
			continue
		}
		var r Report
		if json.Unmarshal(bytes.TrimSpace(line[i+len(ReportPrefix):]), &r) == nil && r.Event != "" {
			out = append(out, r)
		}
	}
	return out
}

// Identity is who the workload runs as.
type Identity struct {
	UID, GID uint32
	Groups   []uint32 // supplementary groups from /etc/group
	Home     string
}

// LookupUser resolves an image config's user against the contents of
// /etc/passwd and /etc/group (nil when the file is absent). "" is root.
// Numeric ids need no entry; a name must have one.
func LookupUser(user string, passwd, group []byte) (Identity, error) {
	id := Identity{Home: "/"}
	if user == "" {
		user = "0"
	}
	name, grp, hasGroup := strings.Cut(user, ":")
	found := false
	var uname string
	for _, f := range colonLines(passwd, 7) {
		if f[0] == name || f[2] == name {
			uid, err1 := strconv.ParseUint(f[2], 10, 32)
			gid, err2 := strconv.ParseUint(f[3], 10, 32)
			if err1 != nil || err2 != nil {
				continue
			}
			id.UID, id.GID, id.Home, uname, found = uint32(uid), uint32(gid), f[5], f[0], true
			break
		}
	}
	if !found {
		uid, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			return id, fmt.Errorf("user %q: not in /etc/passwd", name)
		}
		id.UID, id.GID = uint32(uid), uint32(uid)
		if uid == 0 {
			id.Home = "/root"
		}
	}
	if id.Home == "" {
		id.Home = "/"
	}
	groups := colonLines(group, 4)
	if hasGroup {
		gfound := false
		for _, f := range groups {
			if f[0] == grp || f[2] == grp {
				if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					id.GID, gfound = uint32(gid), true
					break
				}
			}
		}
		if !gfound {
			gid, err := strconv.ParseUint(grp, 10, 32)
			if err != nil {
				return id, fmt.Errorf("group %q: not in /etc/group", grp)
			}
			id.GID = uint32(gid)
		}
	}
	if uname != "" {
		for _, f := range groups {
			gid, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil || uint32(gid) == id.GID {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == uname {
					id.Groups = append(id.Groups, uint32(gid))
				}
			}
		}
	}
	return id, nil
}

// colonLines splits /etc/passwd-style lines with at least n fields.
func colonLines(b []byte, n int) [][]string {
	var out [][]string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) >= n {
			out = append(out, f)
		}
	}
	return out
}
