//go:build linux

package accel

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KVM ioctls (linux/kvm.h; the same numbers on every architecture).
const (
	kvmio = 0xAE

	iocWrite = 1
	iocRead  = 2

	kvmAPIVersion = 12

	kvmGetAPIVersion       = kvmio << 8 // | 0x00
	kvmCreateVM            = kvmio<<8 | 0x01
	kvmGetVCPUMmapSize     = kvmio<<8 | 0x04
	kvmCreateVCPU          = kvmio<<8 | 0x41
	kvmSetUserMemoryRegion = iocWrite<<30 | uintptr(unsafe.Sizeof(kvmUserspaceMemoryRegion{}))<<16 | kvmio<<8 | 0x46
	kvmRun                 = kvmio<<8 | 0x80
)

// Exit reasons (kvm_run.exit_reason).
const (
	kvmExitIO            = 2
	kvmExitHLT           = 5
	kvmExitMMIO          = 6
	kvmExitShutdown      = 8
	kvmExitFailEntry     = 9
	kvmExitIntr          = 10
	kvmExitInternalError = 17
)

// kvm_run offsets: exit_reason, then the exit union at 32.
const (
	runExitReason = 8
	runUnion      = 32
)

type kvmUserspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// Compile-time size checks against linux/kvm.h.
const (
	_ = unsafe.Sizeof(kvmUserspaceMemoryRegion{}) - 32
	_ = 32 - unsafe.Sizeof(kvmUserspaceMemoryRegion{})
)

func ioctl(fd int, req, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// guestEvent is what one KVM_RUN exit meant.
type guestEvent int

const (
	guestNothing guestEvent = iota // an exit on the way (e.g. the I/O before HLT)
	guestTick                      // the guest finished one of its loops
	guestDone                      // the guest finished
)

// kvmGuest is an architecture's probe guest.
type kvmGuest interface {
	// memory is the guest-physical base and size of the guest's memory.
	memory() (base uint64, size int)
	// load writes the guest into its memory and returns its entry point.
	load(mem []byte) (entry uint64)
	// setup readies the vCPU to run from entry.
	setup(vm, vcpu int, entry uint64) error
	// exit judges one KVM_RUN exit; err when the guest did something else
	// than it must.
	exit(run []byte, reason uint32) (guestEvent, error)
}

// kvmProof runs the probe guest on the KVM device dev: a bounded sequence of
// KVM_RUNs that must see each of the guest's loops report within budget
// and then the guest finish. progress reports each stage before it starts, so
// a parent that kills a hung child knows where it hung.
func kvmProof(dev string, budget time.Duration, progress func(stage string)) (works bool, reason, detail string) {
	g := newKVMGuest()
	if g == nil {
		return false, ReasonKVMUnsupportedArch, "no probe guest for " + runtime.GOARCH
	}
	// vCPU ioctls belong to one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	progress("open")
	kvm, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, ReasonKVMOpenFailed, fmt.Sprintf("open %s: %v", dev, err)
	}
	defer unix.Close(kvm)
	v, err := ioctl(kvm, kvmGetAPIVersion, 0)
	if err != nil {
		return false, ReasonKVMAPIMismatch, fmt.Sprintf("KVM_GET_API_VERSION: %v", err)
	}
	if v != kvmAPIVersion {
		return false, ReasonKVMAPIMismatch, fmt.Sprintf("KVM_GET_API_VERSION is %d, want %d", v, kvmAPIVersion)
	}
	setupFailed := func(what string, err error) (bool, string, string) {
		return false, ReasonKVMSetupFailed, fmt.Sprintf("%s: %v", what, err)
	}

	progress("create_vm")
	vmfd, err := ioctl(kvm, kvmCreateVM, 0)
	if err != nil {
		return setupFailed("KVM_CREATE_VM", err)
	}
	vm := int(vmfd)
	defer unix.Close(vm)

	base, size := g.memory()
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return setupFailed("mmap guest memory", err)
	}
	defer unix.Munmap(mem)
	entry := g.load(mem)
	region := kvmUserspaceMemoryRegion{GuestPhysAddr: base, MemorySize: uint64(size),
		UserspaceAddr: uint64(uintptr(unsafe.Pointer(&mem[0])))}
	if _, err := ioctl(vm, kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region))); err != nil {
		return setupFailed("KVM_SET_USER_MEMORY_REGION", err)
	}

	progress("create_vcpu")
	vcpufd, err := ioctl(vm, kvmCreateVCPU, 0)
	if err != nil {
		return setupFailed("KVM_CREATE_VCPU", err)
	}
	vcpu := int(vcpufd)
	defer unix.Close(vcpu)
	runSize, err := ioctl(kvm, kvmGetVCPUMmapSize, 0)
	if err != nil {
		return setupFailed("KVM_GET_VCPU_MMAP_SIZE", err)
	}
	if runSize < runUnion+32 {
		return setupFailed("KVM_GET_VCPU_MMAP_SIZE", fmt.Errorf("size %d too small", runSize))
	}
	run, err := unix.Mmap(vcpu, 0, int(runSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return setupFailed("mmap kvm_run", err)
	}
	defer unix.Munmap(run)
	if err := g.setup(vm, vcpu, entry); err != nil {
		return setupFailed("vcpu setup", err)
	}

	progress("kvm_run")
	start := time.Now()
	loops := 0
	const maxRuns = 1000 // the guest needs guestLoops+3; the rest is for EINTR
	for range maxRuns {
		if _, err := ioctl(vcpu, kvmRun, 0); err != nil {
			if err == unix.EINTR || err == unix.EAGAIN {
				continue
			}
			return false, ReasonKVMRunFailed, fmt.Sprintf("KVM_RUN after %d of %d loops: %v", loops, guestLoops, err)
		}
		exit := binary.NativeEndian.Uint32(run[runExitReason:])
		if exit == kvmExitIntr {
			continue
		}
		ev, err := g.exit(run, exit)
		if err != nil {
			return false, ReasonKVMRunFailed, fmt.Sprintf("after %d of %d loops: %v", loops, guestLoops, err)
		}
		took := time.Since(start)
		switch ev {
		case guestTick:
			loops++
			progress(fmt.Sprintf("kvm_run: loop %d/%d after %s", loops, guestLoops, took.Round(time.Millisecond)))
			if took > budget {
				return false, ReasonKVMGuestTooSlow, fmt.Sprintf(
					"%s: the probe guest ran %d of %d loops of %s iterations in %s, about %s iterations/s "+
						"(a CPU running it in hardware needs milliseconds for all): KVM is emulating the guest "+
						"rather than running it on the CPU, so real guests would appear hung",
					dev, loops, guestLoops, siCount(guestLoopIterations), took.Round(time.Millisecond),
					siCount(float64(loops*guestLoopIterations)/took.Seconds()))
			}
		case guestDone:
			if loops != guestLoops {
				return false, ReasonKVMRunFailed, fmt.Sprintf("guest finished after %d of %d loops", loops, guestLoops)
			}
			return true, ReasonOK, fmt.Sprintf("%s: the probe guest (%s) ran %d loops of %s iterations in %s",
				dev, guestDescription, guestLoops, siCount(guestLoopIterations), took.Round(time.Microsecond))
		}
	}
	return false, ReasonKVMRunFailed, fmt.Sprintf("guest did not finish after %d KVM_RUNs", maxRuns)
}

// siCount writes n with a k/M/G suffix.
func siCount(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fG", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fk", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}

// exitError describes an exit the probe guest should not have caused.
func exitError(run []byte, reason uint32) error {
	switch reason {
	case kvmExitFailEntry:
		return fmt.Errorf("KVM_EXIT_FAIL_ENTRY (hardware entry failure reason %#x)", binary.NativeEndian.Uint64(run[runUnion:]))
	case kvmExitInternalError:
		return fmt.Errorf("KVM_EXIT_INTERNAL_ERROR (suberror %d)", binary.NativeEndian.Uint32(run[runUnion:]))
	case kvmExitShutdown:
		return fmt.Errorf("KVM_EXIT_SHUTDOWN (the guest triple-faulted)")
	}
	return fmt.Errorf("unexpected KVM exit reason %d", reason)
}
