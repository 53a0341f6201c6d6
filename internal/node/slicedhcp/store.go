// Package slicedhcp is the node agent's DHCP service for slice VMs: a
// Store of fixed reservations (a slot's deterministic MAC → its private
// IP, given in slice.vm_provision's params) persisted under the agent's
// state directory, and a DHCPv4 Server (github.com/insomniacslk/dhcp's
// server4) that answers, on the slice bridge, only the MACs the Store
// holds, with the reserved address, the subnet mask, the gateway, the
// resolvers and the lease time. There is no dynamic pool: an unknown MAC
// gets no answer.
//
// The Store keeps one file per VM, <dir>/<vm>.conf, with one
// "mac,ip,hostname" line per reservation: the format of dnsmasq's
// --dhcp-hostsdir, so an operator who prefers dnsmasq can point one at
// the same directory. A file is replaced atomically; the Store is loaded
// from the files when it opens (an agent restart restores every
// reservation) and Prune drops those of VMs that no longer exist (what an
// agent crash in the middle of a provision leaves behind).
//
// It never configures interfaces, bridges or NAT (internal/node/netsetup
// does); the Server needs the bridge up with its address. The Server runs
// on Linux only; elsewhere NewServer fails with ErrUnsupported.
package slicedhcp

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/drover-dev/drover/internal/node/atomicfile"
)

// ErrConflict is wrapped by Reserve when another VM already holds a MAC
// or an address asked for.
var ErrConflict = errors.New("reservation conflict")

// ErrUnsupported is returned by NewServer outside Linux.
var ErrUnsupported = errors.New("the slice DHCP server is not supported on this platform")

// Reservation is one fixed lease: MAC gets IP, and the hostname.
type Reservation struct {
	MAC      net.HardwareAddr
	IP       netip.Addr
	Hostname string
}

// String is the reservation's line in its VM's file ("mac,ip,hostname").
func (r Reservation) String() string {
	s := r.MAC.String() + "," + r.IP.String()
	if r.Hostname != "" {
		s += "," + r.Hostname
	}
	return s
}

// Store holds the reservations of every slice VM of the host, by VM name.
// It is safe for concurrent use.
type Store struct {
	dir    string
	subnet netip.Prefix // when valid, reservations must lie inside it
	mu     sync.RWMutex
	byVM   map[string][]Reservation
}

// OpenStore loads the reservations under dir (a directory that does not
// exist yet holds none; it is made by the first Reserve). subnet, when
// valid, is the slice network: a reservation outside it, or on its
// network, first (gateway) or broadcast address, is refused. A file that
// cannot be parsed fails the open, naming it.
func OpenStore(dir string, subnet netip.Prefix) (*Store, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("slicedhcp: store dir %q must be an absolute path", dir)
	}
	s := &Store{dir: filepath.Clean(dir), subnet: subnet.Masked(), byVM: map[string][]Reservation{}}
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("slicedhcp: read %s: %w", s.dir, err)
	}
	for _, e := range ents {
		vm, ok := strings.CutSuffix(e.Name(), ".conf")
		if !ok || strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("slicedhcp: read %s: %w", e.Name(), err)
		}
		rs, err := ParseHosts(b)
		if err != nil {
			return nil, fmt.Errorf("slicedhcp: %s: %w", filepath.Join(s.dir, e.Name()), err)
		}
		s.byVM[vm] = rs
	}
	return s, nil
}

// Dir is the directory the Store keeps its files in.
func (s *Store) Dir() string { return s.dir }

// Path is vm's reservation file.
func (s *Store) Path(vm string) string { return filepath.Join(s.dir, vm+".conf") }

// ParseHosts parses "mac,ip[,hostname]" lines (blank lines and lines
// starting with # are skipped).
func ParseHosts(b []byte) ([]Reservation, error) {
	var out []Reservation
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("line %d: want mac,ip[,hostname], got %q", i+1, line)
		}
		r, err := NewReservation(f[0], f[1], strings.Join(f[2:], ""))
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// NewReservation parses a unicast Ethernet MAC and an IPv4 address.
func NewReservation(mac, ip, hostname string) (Reservation, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(mac))
	if err != nil || len(hw) != 6 {
		return Reservation{}, fmt.Errorf("mac %q: want an Ethernet address", mac)
	}
	if hw[0]&1 != 0 {
		return Reservation{}, fmt.Errorf("mac %q is a multicast address", mac)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(ip))
	if err != nil || !a.Is4() {
		return Reservation{}, fmt.Errorf("ip %q: want an IPv4 address", ip)
	}
	if hostname = strings.TrimSpace(hostname); strings.ContainsAny(hostname, ", \t") {
		return Reservation{}, fmt.Errorf("hostname %q: no commas or spaces", hostname)
	}
	return Reservation{MAC: hw, IP: a, Hostname: hostname}, nil
}

// checkAddr refuses an address outside the store's subnet or one that is
// not a host address there.
func (s *Store) checkAddr(a netip.Addr) error {
	if !s.subnet.IsValid() {
		return nil
	}
	if !s.subnet.Contains(a) {
		return fmt.Errorf("%s is outside the slice network %s", a, s.subnet)
	}
	if a == s.subnet.Addr() || a == s.subnet.Addr().Next() || a == lastAddr(s.subnet) {
		return fmt.Errorf("%s is the network, gateway or broadcast address of %s", a, s.subnet)
	}
	return nil
}

// Reserve sets vm's reservations to rs (replacing what it had) and
// persists them before they are served. It reports whether vm had a file
// before. A MAC or address another VM holds, or given twice, is an error
// wrapping ErrConflict; nothing changes then.
func (s *Store) Reserve(vm string, rs []Reservation) (had bool, err error) {
	if err := checkVM(vm); err != nil {
		return false, err
	}
	if len(rs) == 0 {
		return false, fmt.Errorf("slicedhcp: reserve %s: no reservations", vm)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	macs, ips := map[string]string{}, map[netip.Addr]string{}
	for other, list := range s.byVM {
		if other == vm {
			continue
		}
		for _, r := range list {
			macs[r.MAC.String()], ips[r.IP] = other, other
		}
	}
	var lines strings.Builder
	for _, r := range rs {
		if err := s.checkAddr(r.IP); err != nil {
			return false, fmt.Errorf("slicedhcp: reserve %s: %w", vm, err)
		}
		if o, ok := macs[r.MAC.String()]; ok {
			return false, fmt.Errorf("slicedhcp: reserve %s: mac %s is reserved for %s: %w", vm, r.MAC, orSelf(o, vm), ErrConflict)
		}
		if o, ok := ips[r.IP]; ok {
			return false, fmt.Errorf("slicedhcp: reserve %s: ip %s is reserved for %s: %w", vm, r.IP, orSelf(o, vm), ErrConflict)
		}
		macs[r.MAC.String()], ips[r.IP] = vm, vm
		lines.WriteString(r.String() + "\n")
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return false, fmt.Errorf("slicedhcp: create %s: %w", s.dir, err)
	}
	_, had = s.byVM[vm]
	if !had {
		_, err := os.Lstat(s.Path(vm))
		had = err == nil
	}
	if err := atomicfile.Write(s.Path(vm), []byte(lines.String()), 0o644); err != nil {
		return had, fmt.Errorf("slicedhcp: write %s: %w", s.Path(vm), err)
	}
	s.byVM[vm] = append([]Reservation(nil), rs...)
	return had, nil
}

func orSelf(owner, vm string) string {
	if owner == vm {
		return vm + " twice"
	}
	return owner
}

// Drop removes vm's reservations (file first, then the served table is
// left as is only if the file could not be removed). It reports whether
// there were any.
func (s *Store) Drop(vm string) (bool, error) {
	if err := checkVM(vm); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, had := s.byVM[vm]
	err := os.Remove(s.Path(vm))
	switch {
	case err == nil:
		had = true
		_ = atomicfile.SyncDir(s.dir)
	case !errors.Is(err, fs.ErrNotExist):
		return had, fmt.Errorf("slicedhcp: remove %s: %w", s.Path(vm), err)
	}
	delete(s.byVM, vm)
	return had, nil
}

// Lookup returns the reservation of mac and the VM holding it.
func (s *Store) Lookup(mac net.HardwareAddr) (vm string, r Reservation, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for v, list := range s.byVM {
		for _, r := range list {
			if string(r.MAC) == string(mac) {
				return v, r, true
			}
		}
	}
	return "", Reservation{}, false
}

// Reservations returns vm's reservations.
func (s *Store) Reservations(vm string) []Reservation {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]Reservation(nil), s.byVM[vm]...)
}

// VMs returns the names of the VMs holding reservations, sorted.
func (s *Store) VMs() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.byVM))
	for vm := range s.byVM {
		out = append(out, vm)
	}
	sort.Strings(out)
	return out
}

// Prune drops the reservations of every VM keep says no to (the agent
// passes "the runtime still has this slice VM") and returns their names.
// It stops at the first file it cannot remove.
func (s *Store) Prune(keep func(vm string) bool) ([]string, error) {
	var dropped []string
	for _, vm := range s.VMs() {
		if keep(vm) {
			continue
		}
		if _, err := s.Drop(vm); err != nil {
			return dropped, err
		}
		dropped = append(dropped, vm)
	}
	return dropped, nil
}

// checkVM refuses a name that is not a plain file name.
func checkVM(vm string) error {
	if vm == "" || vm != filepath.Base(vm) || vm == "." || vm == ".." || strings.HasPrefix(vm, ".") {
		return fmt.Errorf("slicedhcp: vm name %q is not a plain file name", vm)
	}
	return nil
}

// lastAddr is the broadcast address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= 1<<(32-p.Bits()) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
