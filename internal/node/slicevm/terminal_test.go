package slicevm

import (
	"encoding/json"
	"errors"
	"net/netip"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/drover-dev/drover/internal/node/slicedhcp"
)

const (
	hostKeyA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOuQ4ruXNBrGJtrDdhNLziqmo76C7m8/YwZ8DYataZU8"
	hostKeyB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ8hb1kP2a/6cHYn9yY3mbAAGHFdBw/3A9TRM8Gpg1yE"
)

// TestSerialHostKeys: the last block of a serial log wins (the log keeps
// earlier boots), console noise before a key and non-key lines are
// skipped, and an unterminated block pins nothing.
func TestSerialHostKeys(t *testing.T) {
	tests := []struct {
		name, log string
		want      []string
	}{
		{"none", "booting\nDROVER-GUEST-READY\n", nil},
		{"one block", "x\r\n" + HostKeysBegin + "\r\n" + hostKeyA + " root@vm\r\n" + HostKeysEnd + "\r\n", []string{hostKeyA}},
		{"last boot wins", HostKeysBegin + "\n" + hostKeyA + "\n" + HostKeysEnd + "\nreboot\n" +
			"[   3.1] cloud-init[1]: " + HostKeysBegin + "\n[   3.1] cloud-init[1]: " + hostKeyB + " root@vm\nnot a key\n" +
			"[   3.1] cloud-init[1]: " + HostKeysEnd + "\n", []string{hostKeyB}},
		{"unterminated", HostKeysBegin + "\n" + hostKeyA + "\n", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := SerialHostKeys([]byte(tc.log)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("SerialHostKeys = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTerminalRecord: only the owning allocation gets the record, an
// address beyond the loopback is refused, and a name that is not a VM's
// never reaches the file system.
func TestTerminalRecord(t *testing.T) {
	e := newEnv(t, envOpts{})
	write := func(rec Terminal) {
		b, _ := json.Marshal(rec)
		if err := writeAtomic(e.p.terminalPath(rec.VMName), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(Terminal{VMName: "vm-1", AllocationID: "alloc-1", User: "ubuntu", SSHHost: "127.0.0.1", SSHPort: 2222,
		HostKeys: []string{hostKeyA}, HostKeySource: HostKeyFromSerial, KeyPath: e.p.keyPath("vm-1")})
	write(Terminal{VMName: "vm-2", AllocationID: "alloc-2", User: "ubuntu", SSHHost: "10.0.0.5", SSHPort: 22,
		HostKeys: []string{hostKeyA}})
	got, err := e.p.Terminal("vm-1", "alloc-1")
	if err != nil || got.Addr() != "127.0.0.1:2222" || got.User != "ubuntu" || len(got.HostKeys) != 1 {
		t.Fatalf("Terminal(vm-1, alloc-1) = %+v, %v", got, err)
	}
	for _, tc := range []struct {
		vm, alloc string
		want      error
	}{
		{"vm-1", "alloc-2", ErrNotOwned},
		{"vm-2", "alloc-2", ErrNotLocal},
		{"vm-3", "alloc-1", ErrNoTerminal},
		{"../terminal/vm-1", "alloc-1", ErrNoTerminal},
		{".vm", "alloc-1", ErrNoTerminal},
	} {
		if _, err := e.p.Terminal(tc.vm, tc.alloc); !errors.Is(err, tc.want) {
			t.Errorf("Terminal(%q, %q) = %v, want %v", tc.vm, tc.alloc, err, tc.want)
		}
	}
	if ok, err := e.p.removeTerminal("vm-1"); !ok || err != nil {
		t.Fatalf("removeTerminal = %v, %v", ok, err)
	}
	if _, err := e.p.Terminal("vm-1", "alloc-1"); !errors.Is(err, ErrNoTerminal) {
		t.Errorf("after removal: %v", err)
	}
}

// TestTerminalRecordSliceNetwork: a tap-networked VM's record (its SSH at
// its own address on the slice bridge) is accepted when the address lies
// in the agent's slice network and is the VM's own DHCP reservation; the
// record of a VM naming another VM's address, the gateway, an address
// outside the network, or any address when no slice network is
// configured, is refused.
func TestTerminalRecordSliceNetwork(t *testing.T) {
	e := newEnv(t, envOpts{})
	st, err := slicedhcp.OpenStore(filepath.Join(t.TempDir(), "dhcp-hosts.d"), netip.MustParsePrefix("10.77.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	for vm, ip := range map[string]string{"vm-a": "10.77.0.10", "vm-b": "10.77.0.11"} {
		r, err := slicedhcp.NewReservation(map[string]string{"vm-a": "52:54:00:00:00:0a", "vm-b": "52:54:00:00:00:0b"}[vm], ip, vm)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Reserve(vm, []slicedhcp.Reservation{r}); err != nil {
			t.Fatal(err)
		}
	}
	opts := e.p.opts
	opts.DHCP = st
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	write := func(vm, host string) {
		b, _ := json.Marshal(Terminal{VMName: vm, AllocationID: "alloc-" + vm, User: "ubuntu", SSHHost: host, SSHPort: 22,
			HostKeys: []string{hostKeyA}, KeyPath: p.keyPath(vm)})
		if err := writeAtomic(p.terminalPath(vm), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("vm-a", "10.77.0.10") // its own reservation
	write("vm-b", "10.77.0.10") // vm-a's address
	write("vm-c", "10.77.0.1")  // the gateway
	write("vm-d", "10.78.0.10") // outside the slice network
	write("vm-e", "127.0.0.1")  // user-mode forward: always fine
	tg, err := p.GuestTarget("vm-a", "alloc-vm-a")
	if err != nil || tg.Addr != "10.77.0.10:22" || tg.SliceNet.String() != "10.77.0.0/24" || tg.VMAddr.String() != "10.77.0.10" {
		t.Fatalf("GuestTarget(vm-a) = %+v, %v", tg, err)
	}
	for vm, want := range map[string]error{"vm-b": ErrNotLocal, "vm-c": ErrNotLocal, "vm-d": ErrNotLocal, "vm-e": nil} {
		if _, err := p.Terminal(vm, "alloc-"+vm); !errors.Is(err, want) {
			t.Errorf("Terminal(%s) = %v, want %v", vm, err, want)
		}
	}
	// The same record without a configured slice network: refused.
	write("vm-a", "10.77.0.10")
	if _, err := e.p.Terminal("vm-a", "alloc-vm-a"); !errors.Is(err, ErrNotLocal) {
		t.Errorf("without a slice network: %v", err)
	}
}
