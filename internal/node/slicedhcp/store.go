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
// the same directory. The files are the state: a file is replaced
// atomically, the server reads the directory for each request (so what
// is on disk is what is served, whoever removed a file, and an agent
// restart serves every reservation again), and Prune drops the files of
// VMs that no longer exist (what an agent crash in the middle of a
// provision leaves behind).
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

// Store is the reservations of every slice VM of the host, one file per
// VM in its directory. It is safe for concurrent use; writes are
// serialised so that conflict checks see every other VM's file.
type Store struct {
	dir    string
	subnet netip.Prefix // when valid, reservations must lie inside it
	mu     sync.Mutex
}

// OpenStore checks the reservations under dir (a directory that does not
// exist yet holds none; it is made by the first Reserve). subnet, when
// valid, is the slice network: a reservation outside it, or on its
// network, first (gateway) or broadcast address, is refused. Only a
// directory that cannot be read fails the open; a file that cannot be
// parsed is skipped where it is read, and Bad names it.
func OpenStore(dir string, subnet netip.Prefix) (*Store, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("slicedhcp: store dir %q must be an absolute path", dir)
	}
	s := &Store{dir: filepath.Clean(dir), subnet: subnet.Masked()}
	if _, _, err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

// Bad lists the files that cannot be read or parsed (they serve nothing).
func (s *Store) Bad() []error {
	_, bad, err := s.load()
	if err != nil {
		return append(bad, err)
	}
	return bad
}

// load reads every VM's file. A file that cannot be read or parsed is
// reported in bad and holds no reservation (its VM is still listed, so
// Prune can drop it); err is for a directory that cannot be read.
func (s *Store) load() (byVM map[string][]Reservation, bad []error, err error) {
	byVM = map[string][]Reservation{}
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return byVM, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("slicedhcp: read %s: %w", s.dir, err)
	}
	for _, e := range ents {
		vm, ok := strings.CutSuffix(e.Name(), ".conf")
		if !ok || strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(s.dir, e.Name())
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		var rs []Reservation
		if err == nil {
			rs, err = ParseHosts(b)
		}
		if err != nil {
			bad = append(bad, fmt.Errorf("slicedhcp: %s: %w", path, err))
			byVM[vm] = nil
			continue
		}
		byVM[vm] = rs
	}
	return byVM, bad, nil
}

// Subnet is the slice network the Store checks reservations against;
// zero when none was given.
func (s *Store) Subnet() netip.Prefix { return s.subnet }

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
	all, bad, err := s.load()
	if err != nil {
		return false, err
	}
	if len(bad) > 0 {
		return false, fmt.Errorf("slicedhcp: reserve %s: cannot check for conflicts: %w", vm, errors.Join(bad...))
	}
	macs, ips := map[string]string{}, map[netip.Addr]string{}
	for other, list := range all {
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
	_, err = os.Lstat(s.Path(vm))
	had = err == nil
	if err := atomicfile.Write(s.Path(vm), []byte(lines.String()), 0o644); err != nil {
		return had, fmt.Errorf("slicedhcp: write %s: %w", s.Path(vm), err)
	}
	return had, nil
}

func orSelf(owner, vm string) string {
	if owner == vm {
		return vm + " twice"
	}
	return owner
}

// Drop removes vm's reservations. It reports whether there were any.
func (s *Store) Drop(vm string) (bool, error) {
	if err := checkVM(vm); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := os.Remove(s.Path(vm))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("slicedhcp: remove %s: %w", s.Path(vm), err)
	}
	_ = atomicfile.SyncDir(s.dir)
	return true, nil
}

// Lookup returns the reservation of mac and the VM holding it, read from
// the files as they are now; bad lists files it had to skip.
func (s *Store) Lookup(mac net.HardwareAddr) (vm string, r Reservation, ok bool, bad []error) {
	all, bad, err := s.load()
	if err != nil {
		return "", Reservation{}, false, append(bad, err)
	}
	for v, list := range all {
		for _, r := range list {
			if string(r.MAC) == string(mac) {
				return v, r, true, bad
			}
		}
	}
	return "", Reservation{}, false, bad
}

// Reservations returns vm's reservations (none when its file is missing
// or unreadable).
func (s *Store) Reservations(vm string) []Reservation {
	b, err := os.ReadFile(s.Path(vm))
	if err != nil {
		return nil
	}
	rs, _ := ParseHosts(b)
	return rs
}

// VMs returns the names of the VMs holding reservations, sorted.
func (s *Store) VMs() []string {
	all, _, _ := s.load()
	out := make([]string, 0, len(all))
	for vm := range all {
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
