package slicevm

// The provisioner's own files under StateDir: per-slot leases, the DHCP
// reservations (internal/node/slicedhcp), guest telemetry registrations and terminal keys.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/guestssh"

	"github.com/drover-dev/drover/internal/node/atomicfile"

	"golang.org/x/crypto/ssh"

	"github.com/drover-dev/drover/internal/wire/task"
)

// Lease is one slot's exclusive lease, StateDir/leases/<slot_id>.json.
type Lease struct {
	SlotID       string    `json:"slot_id"`
	VMName       string    `json:"vm_name"`
	AllocationID string    `json:"allocation_id"`
	PCIAddress   string    `json:"pci_address"`
	FabricDevice string    `json:"fabric_device,omitempty"`
	NVMeDevice   string    `json:"nvme_device,omitempty"`
	AcquiredAt   time.Time `json:"acquired_at"`
}

func (p *Provisioner) leaseDir() string { return filepath.Join(p.opts.StateDir, "leases") }

func (p *Provisioner) leasePath(slotID string) string {
	return filepath.Join(p.leaseDir(), slotID+".json")
}

// acquireLease takes slot's lease for vm. The lease file appears
// atomically with its full content (written beside it, then hard-linked
// into place, which fails if it exists). A lease vm already holds for the
// same allocation is kept (created false); anyone else's is a conflict.
func (p *Provisioner) acquireLease(vm, alloc string, s task.VMSlot) (created bool, err error) {
	dir := p.leaseDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, failf(CodeLeaseFailed, "create lease dir: %w", err)
	}
	b, err := json.MarshalIndent(Lease{SlotID: s.SlotID, VMName: vm, AllocationID: alloc, PCIAddress: s.PCIAddress,
		FabricDevice: s.FabricDevice, NVMeDevice: s.NVMeDevice, AcquiredAt: p.opts.Now().UTC()}, "", "  ")
	if err != nil {
		return false, failf(CodeLeaseFailed, "encode lease: %w", err)
	}
	tmp, err := writeTemp(dir, append(b, '\n'), 0o600)
	if err != nil {
		return false, failf(CodeLeaseFailed, "write lease for slot %s: %w", s.SlotID, err)
	}
	defer func() { _ = os.Remove(tmp) }()
	lerr := os.Link(tmp, p.leasePath(s.SlotID))
	if lerr == nil {
		_ = atomicfile.SyncDir(dir)
		return true, nil
	}
	if !errors.Is(lerr, fs.ErrExist) {
		return false, failf(CodeLeaseFailed, "take lease for slot %s: %w", s.SlotID, lerr)
	}
	held, err := p.readLease(s.SlotID)
	if err != nil {
		return false, failf(CodeLeaseFailed, "slot %s has an unreadable lease (remove %s once no VM uses the slot): %w",
			s.SlotID, p.leasePath(s.SlotID), err)
	}
	if held.VMName == vm && held.AllocationID == alloc {
		return false, nil
	}
	return false, failf(CodeLeaseConflict, "slot %s is leased to vm %s (allocation %s) since %s",
		s.SlotID, held.VMName, held.AllocationID, held.AcquiredAt.Format(time.RFC3339))
}

func (p *Provisioner) readLease(slotID string) (Lease, error) {
	b, err := os.ReadFile(p.leasePath(slotID))
	if err != nil {
		return Lease{}, err
	}
	var l Lease
	if err := json.Unmarshal(b, &l); err != nil {
		return Lease{}, fmt.Errorf("parse %s: %w", p.leasePath(slotID), err)
	}
	if l.SlotID != slotID || l.VMName == "" {
		return Lease{}, fmt.Errorf("%s does not name slot %s and a vm", p.leasePath(slotID), slotID)
	}
	return l, nil
}

// leasesOf returns the leases vm holds, by slot id.
func (p *Provisioner) leasesOf(vm string) ([]Lease, error) {
	all, err := p.allLeases()
	if err != nil {
		return nil, err
	}
	var out []Lease
	for _, l := range all {
		if l.VMName == vm {
			out = append(out, l)
		}
	}
	return out, nil
}

// allLeases returns every readable lease, by slot id (an unreadable one
// is logged and left out).
func (p *Provisioner) allLeases() ([]Lease, error) {
	ents, err := os.ReadDir(p.leaseDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Lease
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		l, err := p.readLease(id)
		if err != nil {
			p.opts.Log.Warn("slicevm: skipping unreadable lease", "slot_id", id, "err", err)
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// releaseLease removes slot's lease if vm holds it; another VM's lease is
// never touched. It reports whether a lease was removed.
func (p *Provisioner) releaseLease(vm, slotID string) (bool, error) {
	l, err := p.readLease(slotID)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if l.VMName != vm {
		return false, nil
	}
	if err := os.Remove(p.leasePath(slotID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	_ = atomicfile.SyncDir(p.leaseDir())
	return true, nil
}

// dhcpPath is vm's reservation file in the DHCP store's directory (the
// format of dnsmasq's --dhcp-hostsdir).
func (p *Provisioner) dhcpPath(vm string) string { return p.opts.DHCP.Path(vm) }

// hostname is vm as a DNS label (runtime ids may hold "_").
func hostname(vm string) string { return strings.ReplaceAll(vm, "_", "-") }

// Guest is one registered guest, as the agent's metrics read it.
type Guest struct {
	VMName         string      `json:"vm_name"`
	AllocationID   string      `json:"allocation_id"`
	DefaultUser    string      `json:"default_user"`
	DriverStrategy string      `json:"driver_strategy"`
	Slots          []GuestSlot `json:"slots"`
	RegisteredAt   time.Time   `json:"registered_at"`
	// Telemetry is the last collection over the brokered SSH channel
	// (nil before the first).
	Telemetry *guestssh.Telemetry `json:"telemetry,omitempty"`
}

// GuestSlot is one slot of a registered guest.
type GuestSlot struct {
	SlotID       string `json:"slot_id"`
	SlotIndex    int    `json:"slot_index"`
	PCIAddress   string `json:"pci_address"`
	FabricDevice string `json:"fabric_device,omitempty"`
	PrivateIP    string `json:"private_ip,omitempty"`
}

func (p *Provisioner) telemetryDir() string { return filepath.Join(p.opts.StateDir, "telemetry") }

func (p *Provisioner) telemetryPath(vm string) string {
	return filepath.Join(p.telemetryDir(), vm+".json")
}

func guestOf(params task.VMProvisionParams, now time.Time) Guest {
	g := Guest{VMName: params.VMName, AllocationID: params.AllocationID, DefaultUser: params.DefaultUsername,
		DriverStrategy: params.DriverStrategy, Slots: []GuestSlot{}, RegisteredAt: now.UTC()}
	for _, s := range params.Slots {
		g.Slots = append(g.Slots, GuestSlot{SlotID: s.SlotID, SlotIndex: s.SlotIndex, PCIAddress: s.PCIAddress,
			FabricDevice: s.FabricDevice, PrivateIP: s.PrivateIP})
	}
	return g
}

// Guests returns the registered guests, sorted by vm_name. A registration
// that cannot be read is logged and left out.
func (p *Provisioner) Guests(ctx context.Context) ([]Guest, error) {
	ents, err := os.ReadDir(p.telemetryDir())
	if errors.Is(err, fs.ErrNotExist) {
		return []Guest{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("slicevm: read guest registrations: %w", err)
	}
	out := []Guest{}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(p.telemetryDir(), e.Name())
		b, err := os.ReadFile(path)
		var g Guest
		if err == nil {
			err = json.Unmarshal(b, &g)
		}
		if err != nil {
			p.opts.Log.Warn("slicevm: skipping unreadable guest registration", "path", path, "err", err)
			continue
		}
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VMName < out[j].VMName })
	return out, nil
}

func (p *Provisioner) keyPath(vm string) string { return filepath.Join(p.opts.StateDir, "keys", vm) }

// terminalKey returns vm's terminal key pair, StateDir/keys/<vm>{,.pub}:
// the existing one when both files are there and match (a retried
// provision keeps the key its guest already trusts), else a new ed25519
// pair. pub is an authorized_keys line.
func (p *Provisioner) terminalKey(vm string) (pub, fingerprint string, created bool, err error) {
	priv := p.keyPath(vm)
	if pub, fp, ok := readKeyPair(priv); ok {
		return pub, fp, false, nil
	}
	if err := os.MkdirAll(filepath.Dir(priv), 0o700); err != nil {
		return "", "", false, err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", false, err
	}
	comment := "drover-terminal@" + vm
	blk, err := ssh.MarshalPrivateKey(key, comment)
	if err != nil {
		return "", "", false, err
	}
	sshPub, err := ssh.NewPublicKey(key.Public())
	if err != nil {
		return "", "", false, err
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " " + comment
	if err := writeAtomic(priv, pem.EncodeToMemory(blk), 0o600); err != nil {
		return "", "", false, err
	}
	if err := writeAtomic(priv+".pub", []byte(line+"\n"), 0o644); err != nil {
		return "", "", false, err
	}
	return line, ssh.FingerprintSHA256(sshPub), true, nil
}

// readKeyPair returns the public line and fingerprint of a stored pair
// whose halves match.
func readKeyPair(priv string) (string, string, bool) {
	pb, err1 := os.ReadFile(priv)
	lb, err2 := os.ReadFile(priv + ".pub")
	if err1 != nil || err2 != nil {
		return "", "", false
	}
	signer, err := ssh.ParsePrivateKey(pb)
	if err != nil {
		return "", "", false
	}
	pk, _, _, _, err := ssh.ParseAuthorizedKey(lb)
	if err != nil || string(pk.Marshal()) != string(signer.PublicKey().Marshal()) {
		return "", "", false
	}
	return strings.TrimSpace(string(lb)), ssh.FingerprintSHA256(pk), true
}

// removeKeyPair deletes vm's terminal key; it reports whether any file
// was there.
func (p *Provisioner) removeKeyPair(vm string) (bool, error) {
	found := false
	for _, f := range []string{p.keyPath(vm), p.keyPath(vm) + ".pub"} {
		err := os.Remove(f)
		switch {
		case err == nil:
			found = true
		case !errors.Is(err, fs.ErrNotExist):
			return found, err
		}
	}
	return found, nil
}

// removeFile removes path; it reports whether it was there.
func removeFile(path string) (bool, error) {
	err := os.Remove(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// exists reports whether path exists (an error other than not-exist
// counts as existing, so nothing is mistaken for absent).
func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// writeTemp writes data to a new hidden file in dir (dnsmasq and the
// readers here skip names starting with ".") and returns its path.
func writeTemp(dir string, data []byte, perm os.FileMode) (path string, err error) {
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return "", err
	}
	if _, err = f.Write(data); err != nil {
		return "", err
	}
	if err = f.Sync(); err != nil {
		return "", err
	}
	return f.Name(), f.Close()
}

// writeAtomic replaces path with data (mode perm), creating its directory
// (0700) if needed.
func writeAtomic(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, data, perm)
}
