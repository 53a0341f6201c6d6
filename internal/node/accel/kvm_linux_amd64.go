//go:build linux && amd64

package accel

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

const (
	kvmGetRegs  = iocRead<<30 | uintptr(unsafe.Sizeof(kvmRegs{}))<<16 | kvmio<<8 | 0x81
	kvmSetRegs  = iocWrite<<30 | uintptr(unsafe.Sizeof(kvmRegs{}))<<16 | kvmio<<8 | 0x82
	kvmGetSregs = iocRead<<30 | uintptr(unsafe.Sizeof(kvmSregs{}))<<16 | kvmio<<8 | 0x83
	kvmSetSregs = iocWrite<<30 | uintptr(unsafe.Sizeof(kvmSregs{}))<<16 | kvmio<<8 | 0x84
)

type kvmRegs struct {
	RAX, RBX, RCX, RDX, RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11, R12, R13, R14, R15   uint64
	RIP, RFLAGS                            uint64
}

type kvmSegment struct {
	Base                         uint64
	Limit                        uint32
	Selector                     uint16
	Type, Present, DPL, DB, S, L uint8
	G, AVL, Unusable, Padding    uint8
}

type kvmDtable struct {
	Base    uint64
	Limit   uint16
	Padding [3]uint16
}

type kvmSregs struct {
	CS, DS, ES, FS, GS, SS, TR, LDT         kvmSegment
	GDT, IDT                                kvmDtable
	CR0, CR2, CR3, CR4, CR8, EFER, APICBase uint64
	InterruptBitmap                         [4]uint64
}

// Compile-time size checks against linux/kvm.h (x86).
const (
	_ = unsafe.Sizeof(kvmRegs{}) - 144
	_ = 144 - unsafe.Sizeof(kvmRegs{})
	_ = unsafe.Sizeof(kvmSregs{}) - 312
	_ = 312 - unsafe.Sizeof(kvmSregs{})
)

const guestDescription = "x86-64 long mode with paging"

// x86Guest runs x86GuestCode in 64-bit long mode, identity-mapped by one
// 2 MiB page.
type x86Guest struct{ sawDone bool }

func newKVMGuest() kvmGuest { return &x86Guest{} }

func (*x86Guest) memory() (uint64, int) { return 0, x86MemSize }

func (*x86Guest) load(mem []byte) uint64 {
	copy(mem[x86CodeAddr:], x86GuestCode())
	binary.LittleEndian.PutUint64(mem[x86PML4:], x86PDPT|3) // present, writable
	binary.LittleEndian.PutUint64(mem[x86PDPT:], x86PD|3)
	binary.LittleEndian.PutUint64(mem[x86PD:], 0|0x83) // a 2 MiB page at 0: present, writable, large
	return x86CodeAddr
}

func (*x86Guest) setup(_, vcpu int, entry uint64) error {
	var sregs kvmSregs
	if _, err := ioctl(vcpu, kvmGetSregs, uintptr(unsafe.Pointer(&sregs))); err != nil {
		return fmt.Errorf("KVM_GET_SREGS: %w", err)
	}
	sregs.CR3 = x86PML4
	sregs.CR4 = 1 << 5        // PAE
	sregs.CR0 = 0x80050033    // PG, AM, WP, NE, ET, MP, PE
	sregs.EFER = 1<<8 | 1<<10 // LME, LMA
	code := kvmSegment{Limit: 0xFFFFFFFF, Selector: 1 << 3, Type: 11, Present: 1, S: 1, L: 1, G: 1}
	data := kvmSegment{Limit: 0xFFFFFFFF, Selector: 2 << 3, Type: 3, Present: 1, S: 1, G: 1}
	sregs.CS = code
	sregs.DS, sregs.ES, sregs.FS, sregs.GS, sregs.SS = data, data, data, data, data
	if _, err := ioctl(vcpu, kvmSetSregs, uintptr(unsafe.Pointer(&sregs))); err != nil {
		return fmt.Errorf("KVM_SET_SREGS: %w", err)
	}
	regs := kvmRegs{RIP: entry, RFLAGS: 2}
	if _, err := ioctl(vcpu, kvmSetRegs, uintptr(unsafe.Pointer(&regs))); err != nil {
		return fmt.Errorf("KVM_SET_REGS: %w", err)
	}
	return nil
}

// kvm_run.io: direction u8, size u8, port u16, count u32, data_offset u64.
func (g *x86Guest) exit(run []byte, reason uint32) (guestEvent, error) {
	switch {
	case reason == kvmExitIO && !g.sawDone:
		io := run[runUnion:]
		dir, size, port, count := io[0], io[1], binary.NativeEndian.Uint16(io[2:]), binary.NativeEndian.Uint32(io[4:])
		off := binary.NativeEndian.Uint64(io[8:])
		if dir != 1 || size != 1 || (port != x86TickPort && port != x86DonePort) || count != 1 || off >= uint64(len(run)) {
			return guestNothing, fmt.Errorf("unexpected KVM_EXIT_IO (direction %d, size %d, port %#x, count %d)", dir, size, port, count)
		}
		if v := run[off]; v != x86Value {
			return guestNothing, fmt.Errorf("guest wrote %#x to port %#x, want %#x", v, port, x86Value)
		}
		if port == x86DonePort {
			g.sawDone = true
			return guestNothing, nil
		}
		return guestTick, nil
	case reason == kvmExitHLT && g.sawDone:
		return guestDone, nil
	case reason == kvmExitHLT:
		return guestNothing, fmt.Errorf("guest halted before it was done")
	}
	return guestNothing, exitError(run, reason)
}
