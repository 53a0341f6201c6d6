package instances

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Instance validation limits.
const (
	minInstanceMemoryMiB = 64
	maxCmdlineLen        = 4096
	maxSerialMarkerLen   = 256
)

var (
	// instanceNameRE is an instance name: a DNS label.
	instanceNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	// groupNameRE leaves room for the "-<n>" suffix of scaled instances.
	groupNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,55}$`)
	sha256RE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	posixUserRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

// fieldErrs collects field errors under a prefix ("spec").
type fieldErrs struct {
	prefix string
	list   []api.FieldError
}

func (f *fieldErrs) add(field, format string, args ...any) {
	if f.prefix != "" {
		field = f.prefix + "." + field
	}
	f.list = append(f.list, api.FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// validateCreate checks a CreateInstanceRequest; named is false for a scale
// template, whose name and group the scale sets.
func validateCreate(req api.CreateInstanceRequest, named bool) []api.FieldError {
	f := &fieldErrs{}
	if named {
		if !instanceNameRE.MatchString(req.Name) {
			f.add("name", "must match %s", instanceNameRE)
		}
		if req.Group != "" && !groupNameRE.MatchString(req.Group) {
			f.add("group", "must match %s", groupNameRE)
		}
	}
	if req.HostID != "" {
		if err := api.ValidHostID(req.HostID); err != nil {
			f.add("host_id", "%v", err)
		}
	}
	validateLabels(f, "host_labels", req.HostLabels)
	validateLabels(f, "labels", req.Labels)
	f.list = append(f.list, validateSpec(req.Spec, "spec")...)
	return f.list
}

func validateLabels(f *fieldErrs, field string, l map[string]string) {
	for k := range l {
		if k == "" || len(k) > 63 {
			f.add(field, "label keys must be 1-63 characters")
			return
		}
	}
}

// validateSpec checks an InstanceSpec; prefix names the enclosing field.
func validateSpec(s api.InstanceSpec, prefix string) []api.FieldError {
	f := &fieldErrs{prefix: prefix}
	if !validateRuntime(f, s) {
		validateArtifact(f, "image", s.Image)
	}
	if b := s.Boot; b != nil {
		validateArtifact(f, "boot.kernel", b.Kernel)
		if b.Initrd != nil {
			validateArtifact(f, "boot.initrd", *b.Initrd)
		}
		if len(b.Cmdline) > maxCmdlineLen || strings.ContainsAny(b.Cmdline, "\n\x00") {
			f.add("boot.cmdline", "must be one line of at most %d characters", maxCmdlineLen)
		}
	}
	if s.VCPUs < 1 {
		f.add("vcpus", "vcpus >= 1")
	}
	if s.MemoryMiB < minInstanceMemoryMiB {
		f.add("memory_mib", "memory_mib >= %d", minInstanceMemoryMiB)
	}
	if s.DiskGiB < 0 {
		f.add("disk_gib", "disk_gib >= 0")
	}
	if s.GPUs < 0 {
		f.add("gpus", "gpus >= 0")
	}
	seen := map[string]bool{}
	for i, sl := range s.Slots {
		if sl == "" || seen[sl] {
			f.add(fmt.Sprintf("slots[%d]", i), "slot ids must be non-empty and unique")
		}
		seen[sl] = true
	}
	validateNetwork(f, s.Network, s.Readiness, s.Runtime)
	if c := s.CloudInit; c != nil {
		if c.Hostname != "" && !instanceNameRE.MatchString(c.Hostname) {
			f.add("cloud_init.hostname", "must match %s", instanceNameRE)
		}
		if c.User != "" && !posixUserRE.MatchString(c.User) {
			f.add("cloud_init.user", "must match %s", posixUserRE)
		}
		for i, k := range c.SSHAuthorizedKeys {
			if strings.TrimSpace(k) == "" || strings.ContainsAny(k, "\r\n") {
				f.add(fmt.Sprintf("cloud_init.ssh_authorized_keys[%d]", i), "must be one non-empty line")
			}
		}
	}
	if r := s.Readiness; len(r.SerialMarker) > maxSerialMarkerLen || strings.ContainsAny(r.SerialMarker, "\r\n") {
		f.add("readiness.serial_marker", "must be one line of at most %d characters", maxSerialMarkerLen)
	}
	if s.Readiness.Timeout < 0 {
		f.add("readiness.timeout", "must be >= 0")
	}
	if h := s.HealthCheck; h != nil {
		if h.Interval != 0 && time.Duration(h.Interval) < time.Second {
			f.add("health_check.interval", "must be at least 1s")
		}
		if h.FailureThreshold < 0 {
			f.add("health_check.failure_threshold", "must be >= 0")
		}
	}
	for i, name := range s.Secrets {
		if name == "" || strings.ContainsAny(name, "/\\\x00") || name == "." || name == ".." {
			f.add(fmt.Sprintf("secrets[%d]", i), "must be a plain file name")
		}
	}
	if s.GracefulTimeout < 0 {
		f.add("graceful_timeout", "must be >= 0")
	}
	validatePresetField(f, s)
	return f.list
}

// validateArtifact checks a URL (http, https or file) and its digest.
func validateArtifact(f *fieldErrs, field string, a api.Artifact) {
	u, err := url.Parse(a.URL)
	switch {
	case a.URL == "":
		f.add(field+".url", "required")
	case err != nil:
		f.add(field+".url", "not a URL: %v", err)
	case u.Scheme == "http" || u.Scheme == "https":
		if u.Host == "" {
			f.add(field+".url", "needs a host")
		}
	case u.Scheme == "file":
		if u.Path == "" || !strings.HasPrefix(u.Path, "/") {
			f.add(field+".url", "file URLs need an absolute path")
		}
	default:
		f.add(field+".url", "scheme must be http, https or file")
	}
	if !sha256RE.MatchString(a.SHA256) {
		f.add(field+".sha256", "must be 64 lowercase hex digits")
	}
}

func validateNetwork(f *fieldErrs, n api.NetworkSpec, ready api.Readiness, rt string) {
	switch n.Mode {
	case "", api.NetworkUser:
		if n.Bridge != "" {
			f.add("network.bridge", "only with mode tap")
		}
	case api.NetworkTap:
		if n.Bridge == "" {
			f.add("network.bridge", "required with mode tap")
		}
		if len(n.Forwards) > 0 {
			f.add("network.forwards", "port forwards need mode user")
		}
	case api.NetworkBridge:
		if rt != api.RuntimeMicroVM {
			f.add("network.mode", "bridge is for runtime %q (a VM names its bridge with mode tap)", api.RuntimeMicroVM)
		}
		if n.Bridge != "" {
			f.add("network.bridge", "only with mode tap (mode bridge uses the agent's NODE_AGENT_MICROVM_BRIDGE)")
		}
	default:
		f.add("network.mode", "must be user, tap or bridge (microVMs)")
	}
	if n.MAC != "" {
		if hw, err := net.ParseMAC(n.MAC); err != nil || len(hw) != 6 {
			f.add("network.mac", "must be a 6-byte MAC address such as 52:54:00:12:34:56")
		}
	}
	names := map[string]bool{}
	hostPorts := map[int]bool{}
	guest := map[int]bool{}
	for i, fw := range n.Forwards {
		p := fmt.Sprintf("network.forwards[%d]", i)
		if fw.Name == "" || names[fw.Name] {
			f.add(p+".name", "forward names must be non-empty and unique")
		}
		names[fw.Name] = true
		if fw.GuestPort < 1 || fw.GuestPort > 65535 {
			f.add(p+".guest_port", "must be 1..65535")
		}
		guest[fw.GuestPort] = true
		if fw.HostPort < 0 || fw.HostPort > 65535 {
			f.add(p+".host_port", "must be 0..65535 (0: the agent picks)")
		} else if fw.HostPort != 0 {
			if hostPorts[fw.HostPort] {
				f.add(p+".host_port", "host port %d is forwarded twice", fw.HostPort)
			}
			hostPorts[fw.HostPort] = true
		}
	}
	if ready.TCPPort < 0 || ready.TCPPort > 65535 {
		f.add("readiness.tcp_port", "must be 1..65535")
	} else if ready.TCPPort != 0 && n.Mode != api.NetworkTap && n.Mode != api.NetworkBridge && !guest[ready.TCPPort] {
		f.add("readiness.tcp_port", "guest port %d has no forward (user networking reaches the guest through forwards)", ready.TCPPort)
	}
}
