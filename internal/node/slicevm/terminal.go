package slicevm

// The brokered-terminal record of a provisioned VM: where the node reaches
// the guest's SSH (on its own loopback, or the VM's own address on the
// slice network), which host key the guest reported,
// which allocation owns the VM and which key authenticates. termnode reads
// it through Provisioner.Terminal; nothing in a task names the address.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/node/guestssh"
	"github.com/drover-dev/drover/internal/node/runtime"
)

// Where a Terminal's host keys came from (Terminal.HostKeySource).
const (
	// HostKeyFromSerial: the guest printed them on its serial console
	// between HostKeysBegin and HostKeysEnd (cloud-init's keys_to_console
	// module does, as does the test guest).
	HostKeyFromSerial = "serial_console"
	// HostKeyFirstConnection: the guest reported none; the key its SSH
	// server presented at readiness, on the node's loopback forward right
	// after boot, was pinned.
	HostKeyFirstConnection = "first_connection"
)

// The serial-console block cloud-init prints the guest's host keys in.
const (
	HostKeysBegin = "-----BEGIN SSH HOST KEY KEYS-----"
	HostKeysEnd   = "-----END SSH HOST KEY KEYS-----"
)

// Errors of Provisioner.Terminal (wrapped).
var (
	// ErrNoTerminal: no terminal record for the VM (not provisioned here,
	// released, or provisioned without an ssh forward).
	ErrNoTerminal = errors.New("no brokered terminal for this vm")
	// ErrNotOwned: the VM was provisioned for another allocation.
	ErrNotOwned = errors.New("the vm belongs to another allocation")
	// ErrNotLocal: the recorded SSH address is neither on the node's
	// loopback nor the VM's own address on the slice network
	// (guestssh.CheckAddr).
	ErrNotLocal = errors.New("the vm's ssh address is neither on this node's loopback nor the vm's own on the slice network")
)

// Terminal is a VM's brokered-terminal record, StateDir/terminal/<vm>.json,
// written when the VM became ready and removed on release.
type Terminal struct {
	VMName       string `json:"vm_name"`
	AllocationID string `json:"allocation_id"`
	// User is the guest user the terminal key is authorized for.
	User    string `json:"user"`
	SSHHost string `json:"ssh_host"`
	SSHPort int    `json:"ssh_port"`
	// HostKeys are the guest's SSH host keys (authorized_keys lines); a
	// session accepts only these.
	HostKeys      []string  `json:"host_keys"`
	HostKeySource string    `json:"host_key_source"`
	KeyPath       string    `json:"key_path"` // the terminal key's private half
	RecordedAt    time.Time `json:"recorded_at"`
}

// Addr is the SSH address to dial.
func (t Terminal) Addr() string { return net.JoinHostPort(t.SSHHost, strconv.Itoa(t.SSHPort)) }

func (p *Provisioner) terminalPath(vm string) string {
	return filepath.Join(p.opts.StateDir, "terminal", vm+".json")
}

// Terminal returns vm's terminal record for a session of allocationID. It
// fails with ErrNoTerminal, ErrNotOwned (another allocation's VM) or
// ErrNotLocal (an address guestssh.CheckAddr refuses), wrapped.
func (p *Provisioner) Terminal(vm, allocationID string) (Terminal, error) {
	if err := checkVMName(vm); err != nil {
		return Terminal{}, fmt.Errorf("vm %q: %w", vm, ErrNoTerminal)
	}
	b, err := os.ReadFile(p.terminalPath(vm))
	if errors.Is(err, fs.ErrNotExist) {
		return Terminal{}, fmt.Errorf("vm %q: %w", vm, ErrNoTerminal)
	} else if err != nil {
		return Terminal{}, fmt.Errorf("read terminal record of vm %q: %w", vm, err)
	}
	var t Terminal
	if err := json.Unmarshal(b, &t); err != nil {
		return Terminal{}, fmt.Errorf("parse %s: %w", p.terminalPath(vm), err)
	}
	if t.VMName != vm || t.AllocationID != allocationID {
		return Terminal{}, fmt.Errorf("vm %q (allocation %q), asked for allocation %q: %w", vm, t.AllocationID, allocationID, ErrNotOwned)
	}
	if t.SSHPort < 1 || t.SSHPort > 65535 {
		return Terminal{}, fmt.Errorf("vm %q: port %d: %w", vm, t.SSHPort, ErrNotLocal)
	}
	sliceNet, own := p.guestNet(vm)
	if err := guestssh.CheckAddr(t.Addr(), sliceNet, own); err != nil {
		return Terminal{}, fmt.Errorf("vm %q: %v: %w", vm, err, ErrNotLocal)
	}
	return t, nil
}

// guestNet is the slice network (the DHCP store's subnet: the agent's
// NODE_AGENT_SLICE_CIDR) and vm's own address on it (its first DHCP
// reservation, the address of the MAC its NIC has); zero values when there
// is none.
func (p *Provisioner) guestNet(vm string) (netip.Prefix, netip.Addr) {
	sn := p.opts.DHCP.Subnet()
	if !sn.IsValid() {
		return netip.Prefix{}, netip.Addr{}
	}
	rs := p.opts.DHCP.Reservations(vm)
	if len(rs) == 0 {
		return sn, netip.Addr{}
	}
	return sn, rs[0].IP
}

// checkVMName keeps a name from a task out of other paths.
func checkVMName(vm string) error {
	if vm == "" || vm != filepath.Base(vm) || strings.HasPrefix(vm, ".") {
		return errors.New("not a vm name")
	}
	return nil
}

// recordTerminal writes vm's terminal record once it is ready with an ssh
// forward on the loopback: the host keys from the serial log's last
// HostKeysBegin block, else the key the guest's SSH server presents now.
// It reports what it pinned.
func (pr *provision) recordTerminal(ctx context.Context, st runtime.Status) (string, error) {
	t := Terminal{VMName: pr.params.VMName, AllocationID: pr.params.AllocationID, User: pr.out.DefaultUser,
		SSHHost: pr.out.SSHHost, SSHPort: pr.out.SSHPort, KeyPath: pr.p.keyPath(pr.params.VMName),
		RecordedAt: pr.p.opts.Now().UTC()}
	if st.SerialLog != "" {
		if b, err := os.ReadFile(st.SerialLog); err == nil {
			t.HostKeys, t.HostKeySource = SerialHostKeys(b), HostKeyFromSerial
		}
	}
	if len(t.HostKeys) == 0 {
		key, err := presentedHostKey(ctx, t.Addr())
		if err != nil {
			return "", fmt.Errorf("no host keys on the serial console, and none presented on %s: %w", t.Addr(), err)
		}
		t.HostKeys, t.HostKeySource = []string{key}, HostKeyFirstConnection
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return "", err
	}
	if err := writeAtomic(pr.p.terminalPath(t.VMName), append(b, '\n'), 0o600); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d host key(s) from %s", len(t.HostKeys), t.HostKeySource), nil
}

// SerialHostKeys returns the host keys of the last HostKeysBegin …
// HostKeysEnd block in a serial log (a log may hold earlier boots), as
// authorized_keys lines; lines that are not keys are skipped.
func SerialHostKeys(log []byte) []string {
	var keys, cur []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(strings.TrimRight(sc.Text(), "\r"))
		switch {
		case strings.HasSuffix(line, HostKeysBegin):
			in, cur = true, nil
		case in && strings.HasSuffix(line, HostKeysEnd):
			in, keys = false, cur
		case in:
			if i := strings.Index(line, "ssh-"); i >= 0 {
				line = line[i:]
			} else if i := strings.Index(line, "ecdsa-"); i >= 0 {
				line = line[i:]
			}
			if k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line)); err == nil {
				cur = append(cur, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))))
			}
		}
	}
	return keys
}

// presentedHostKey runs an SSH handshake with addr up to the host key and
// returns the key the server presented (authentication is not attempted).
func presentedHostKey(ctx context.Context, addr string) (string, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	var got ssh.PublicKey
	errGot := errors.New("host key captured")
	cfg := &ssh.ClientConfig{User: "drover-pin", HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
		got = k
		return errGot
	}}
	_, _, _, err = ssh.NewClientConn(conn, addr, cfg)
	if got == nil {
		return "", fmt.Errorf("ssh handshake: %w", err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(got))), nil
}

// removeTerminal deletes vm's terminal record; it reports whether it was
// there.
func (p *Provisioner) removeTerminal(vm string) (bool, error) { return removeFile(p.terminalPath(vm)) }
