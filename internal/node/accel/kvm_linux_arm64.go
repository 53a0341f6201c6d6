//go:build linux && arm64

package accel

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"
)

const (
	kvmSetOneReg          = iocWrite<<30 | uintptr(unsafe.Sizeof(kvmOneReg{}))<<16 | kvmio<<8 | 0xAC
	kvmARMVCPUInit        = iocWrite<<30 | uintptr(unsafe.Sizeof(kvmVCPUInit{}))<<16 | kvmio<<8 | 0xAE
	kvmARMPreferredTarget = iocRead<<30 | uintptr(unsafe.Sizeof(kvmVCPUInit{}))<<16 | kvmio<<8 | 0xAF

	// KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | offsetof(kvm_regs, regs.pc)/4
	kvmRegARM64PC = 0x6000000000000000 | 0x0030000000000000 | 0x0010<<16 | (32*8)/4
)

type kvmVCPUInit struct {
	Target   uint32
	Features [7]uint32
}

type kvmOneReg struct {
	ID   uint64
	Addr uint64
}

// Compile-time size checks against linux/kvm.h (arm64).
const (
	_ = unsafe.Sizeof(kvmVCPUInit{}) - 32
	_ = 32 - unsafe.Sizeof(kvmVCPUInit{})
	_ = unsafe.Sizeof(kvmOneReg{}) - 16
	_ = 16 - unsafe.Sizeof(kvmOneReg{})
)

const guestDescription = "arm64 EL1, MMU off"

// arm64Guest runs arm64GuestCode at EL1 with the MMU off; its stores to
// unbacked addresses exit as KVM_EXIT_MMIO.
type arm64Guest struct{}

func newKVMGuest() kvmGuest { return arm64Guest{} }

func (arm64Guest) memory() (uint64, int) { return arm64GuestAddr, os.Getpagesize() }

func (arm64Guest) load(mem []byte) uint64 {
	copy(mem, arm64GuestCode())
	return arm64GuestAddr
}

func (arm64Guest) setup(vm, vcpu int, entry uint64) error {
	var init kvmVCPUInit
	if _, err := ioctl(vm, kvmARMPreferredTarget, uintptr(unsafe.Pointer(&init))); err != nil {
		return fmt.Errorf("KVM_ARM_PREFERRED_TARGET: %w", err)
	}
	if _, err := ioctl(vcpu, kvmARMVCPUInit, uintptr(unsafe.Pointer(&init))); err != nil {
		return fmt.Errorf("KVM_ARM_VCPU_INIT: %w", err)
	}
	pc := entry
	reg := kvmOneReg{ID: kvmRegARM64PC, Addr: uint64(uintptr(unsafe.Pointer(&pc)))}
	if _, err := ioctl(vcpu, kvmSetOneReg, uintptr(unsafe.Pointer(&reg))); err != nil {
		return fmt.Errorf("KVM_SET_ONE_REG pc: %w", err)
	}
	return nil
}

// kvm_run.mmio: phys_addr u64, data [8]u8, len u32, is_write u8.
func (arm64Guest) exit(run []byte, reason uint32) (guestEvent, error) {
	if reason != kvmExitMMIO {
		return guestNothing, exitError(run, reason)
	}
	m := run[runUnion:]
	addr, length, write := binary.NativeEndian.Uint64(m), binary.NativeEndian.Uint32(m[16:]), m[20]
	if (addr != arm64TickAddr && addr != arm64DoneAddr) || length != 1 || write != 1 {
		return guestNothing, fmt.Errorf("unexpected KVM_EXIT_MMIO (address %#x, len %d, write %d)", addr, length, write)
	}
	if v := m[8]; v != arm64Value {
		return guestNothing, fmt.Errorf("guest stored %#x at %#x, want %#x", v, addr, arm64Value)
	}
	if addr == arm64DoneAddr {
		return guestDone, nil
	}
	return guestTick, nil
}
