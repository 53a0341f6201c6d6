// Package guestssh is the node's one SSH client into slice VM guests: it
// dials a guest's SSH server at an address on the node's own loopback, or
// a tap-networked VM's own address on the agent's slice network
// (CheckAddr), accepts only the host keys pinned at provision, authenticates with the
// VM's terminal key, and runs bounded commands as the guest's root
// (OpenAdmin). On top of it sit the guest-side work of the node: the
// allocation's user (ProvisionUser, DeprovisionUser), telemetry (Collect)
// and the performance probe (Probe). termnode's brokered terminals dial
// through Dial too.
//
// It never dials an address CheckAddr refuses, never accepts an unpinned
// host key, and never reads a key or address from a task: callers pass
// what the node's own provision recorded.
package guestssh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Failure codes of Dial (DialError.Code); termnode reports them as the
// guest_* terminal.open codes.
const (
	// CodeUnavailable: the target cannot be used (an address beyond the
	// loopback, no pinned host key, an unreadable terminal key).
	CodeUnavailable = "guest_terminal_unavailable"
	// CodeUnreachable: nothing answered, or the handshake did not finish.
	CodeUnreachable = "guest_ssh_unreachable"
	// CodeHostKeyMismatch: the guest presented a key that is not pinned.
	CodeHostKeyMismatch = "guest_host_key_mismatch"
	// CodeAuthFailed: the guest refused the terminal key.
	CodeAuthFailed = "guest_auth_failed"
)

// DialTimeout bounds the TCP connect and the SSH handshake.
const DialTimeout = 15 * time.Second

// Target is a guest's SSH server as the node's provision recorded it.
type Target struct {
	// Addr is host:port; CheckAddr must accept it: an IP on the node's
	// loopback, or VMAddr inside SliceNet.
	Addr string
	// User is the guest user the terminal key is authorized for.
	User string
	// KeyPath is the terminal key, an OpenSSH private key file.
	KeyPath string
	// HostKeys are the pinned host keys, authorized_keys lines.
	HostKeys []string
	// SliceNet is the agent's slice network (NODE_AGENT_SLICE_CIDR);
	// zero when none is configured.
	SliceNet netip.Prefix
	// VMAddr is the VM's own address on SliceNet as the node's provision
	// reserved it; zero when it has none.
	VMAddr netip.Addr
}

// DialError is a failed Dial: Code names the hop (Code* constants).
type DialError struct {
	Code string
	Msg  string
	Err  error
}

func (e *DialError) Error() string {
	if e.Err != nil {
		return e.Code + ": " + e.Msg + ": " + e.Err.Error()
	}
	return e.Code + ": " + e.Msg
}

func (e *DialError) Unwrap() error { return e.Err }

// Dial connects to t as user (t.User when ""), checking the pinned host
// keys before authenticating with the terminal key. The handshake is
// bounded by DialTimeout and ctx.
func Dial(ctx context.Context, t Target, user string) (*ssh.Client, error) {
	fail := func(code string, err error, format string, args ...any) error {
		return &DialError{Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
	}
	if user == "" {
		user = t.User
	}
	if err := CheckAddr(t.Addr, t.SliceNet, t.VMAddr); err != nil {
		return nil, fail(CodeUnavailable, err, "ssh target")
	}
	pins, algos, err := parsePins(t.HostKeys)
	if err != nil {
		return nil, fail(CodeUnavailable, err, "no usable pinned host key")
	}
	pem, err := os.ReadFile(t.KeyPath)
	if err != nil {
		return nil, fail(CodeUnavailable, err, "terminal key")
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		return nil, fail(CodeUnavailable, err, "terminal key")
	}
	var mismatch error
	cfg := &ssh.ClientConfig{
		User:              user,
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyAlgorithms: algos,
		Timeout:           DialTimeout,
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			for _, p := range pins {
				if string(p.Marshal()) == string(k.Marshal()) {
					return nil
				}
			}
			mismatch = fmt.Errorf("presented %s %s, pinned %s", k.Type(), ssh.FingerprintSHA256(k), fingerprints(pins))
			return mismatch
		},
	}
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(dctx, "tcp", t.Addr)
	if err != nil {
		return nil, fail(CodeUnreachable, err, "ssh %s", t.Addr)
	}
	deadline, _ := dctx.Deadline()
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(dctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	cc, chans, reqs, err := ssh.NewClientConn(conn, t.Addr, cfg)
	stop()
	if err != nil {
		_ = conn.Close()
		switch {
		case mismatch != nil:
			return nil, fail(CodeHostKeyMismatch, mismatch, "the guest's ssh host key is not the one pinned at provision")
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, fail(CodeAuthFailed, err, "the guest refused the terminal key for user %q", user)
		}
		return nil, fail(CodeUnreachable, err, "ssh handshake with %s", t.Addr)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(cc, chans, reqs), nil
}

// CheckAddr is where the node may dial a guest's SSH server: an IP on
// its loopback (user-mode networking's forward), or, for a tap-networked
// VM, the VM's own address on the slice network: inside sliceNet (the
// agent's NODE_AGENT_SLICE_CIDR; zero when none is configured), equal to
// vmAddr (the address the node's provision reserved for that VM; zero
// when none), and neither the network's own, first (the gateway: the
// agent's bridge) nor broadcast address. Anything else (another host,
// another VM's address, the gateway) is refused.
func CheckAddr(addr string, sliceNet netip.Prefix, vmAddr netip.Addr) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return fmt.Errorf("ssh address %s is not an IP address", addr)
	}
	ip = ip.Unmap()
	if ip.IsLoopback() {
		return nil
	}
	switch {
	case !sliceNet.IsValid():
		return fmt.Errorf("ssh address %s is not on this node's loopback, and no slice network is configured", addr)
	case !sliceNet.Contains(ip):
		return fmt.Errorf("ssh address %s is neither on this node's loopback nor in the slice network %s", addr, sliceNet)
	case !vmAddr.IsValid() || ip != vmAddr.Unmap():
		return fmt.Errorf("ssh address %s is not the vm's own address on the slice network (%s)", addr, orNone(vmAddr))
	}
	n := sliceNet.Masked()
	if ip == n.Addr() || ip == n.Addr().Next() || ip == lastAddr(n) {
		return fmt.Errorf("ssh address %s is the network, gateway or broadcast address of %s", addr, n)
	}
	return nil
}

func orNone(a netip.Addr) string {
	if !a.IsValid() {
		return "none recorded"
	}
	return a.String()
}

// lastAddr is p's last (broadcast) address.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 7; j >= 0; j-- {
			if i*8+(7-j) >= bits {
				b[i] |= 1 << j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// parsePins parses the pinned host keys and returns the host key
// algorithms to offer, so that the guest presents a pinned kind of key.
func parsePins(lines []string) ([]ssh.PublicKey, []string, error) {
	var keys []ssh.PublicKey
	var algos []string
	for _, l := range lines {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			return nil, nil, fmt.Errorf("pinned host key %q: %w", l, err)
		}
		keys = append(keys, k)
		if k.Type() == ssh.KeyAlgoRSA {
			algos = append(algos, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		} else {
			algos = append(algos, k.Type())
		}
	}
	if len(keys) == 0 {
		return nil, nil, errors.New("no host key was pinned at provision")
	}
	return keys, algos, nil
}

func fingerprints(keys []ssh.PublicKey) string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.Type() + " " + ssh.FingerprintSHA256(k)
	}
	return strings.Join(out, ", ")
}
