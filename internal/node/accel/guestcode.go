package accel

import "encoding/binary"

// The probe guests' code lives here, free of build tags, so that its
// encoding is tested on every host.

// The probe guest runs guestLoops loops of guestLoopIterations iterations
// (two instructions each) and reports after each. A CPU running the guest in
// hardware does all of them in milliseconds; a KVM that emulates the guest
// (as a nested host without virtualisation extensions may) needs seconds,
// and real guests there look hung.
const (
	guestLoops          = 20
	guestLoopIterations = 1_000_000
)

// The x86 guest's memory: code, then its page tables.
const (
	x86CodeAddr = 0x1000
	x86PML4     = 0x2000
	x86PDPT     = 0x3000
	x86PD       = 0x4000
	x86MemSize  = 0x10000
	x86TickPort = 0x10
	x86DonePort = 0x11
	x86Value    = 0x42
)

// x86GuestCode is 64-bit code (checked with GNU objdump):
//
//	     mov ebx, guestLoops
//	1:   mov ecx, guestLoopIterations
//	2:   dec ecx
//	     jnz 2b
//	     mov al, 0x42
//	     out 0x10, al   ; one loop done
//	     dec ebx
//	     jnz 1b
//	     out 0x11, al   ; all done
//	     hlt
func x86GuestCode() []byte {
	code := binary.LittleEndian.AppendUint32([]byte{0xBB}, guestLoops) // mov ebx, imm32
	code = binary.LittleEndian.AppendUint32(append(code, 0xB9), guestLoopIterations)
	return append(code,
		0xFF, 0xC9, // dec ecx
		0x75, 0xFC, // jnz -4
		0xB0, x86Value, // mov al, 0x42
		0xE6, x86TickPort, // out 0x10, al
		0xFF, 0xCB, // dec ebx
		0x75, 0xEF, // jnz -17 (to mov ecx)
		0xE6, x86DonePort, // out 0x11, al
		0xF4, // hlt
	)
}

// The arm64 guest's stores go to unbacked addresses, so they exit to us.
const (
	arm64GuestAddr = 0x100000 // 1 MiB: aligned for 4K, 16K and 64K host pages
	arm64TickAddr  = 0x10000000
	arm64DoneAddr  = arm64TickAddr + 8
	arm64Value     = 0x42
)

// arm64GuestCode is A64 code (checked with go tool objdump -gnu):
//
//	    mov  w0, #0x42
//	    mov  x1, #0x10000000
//	    mov  w2, #guestLoops
//	1:  mov  w3, #(guestLoopIterations & 0xffff)
//	    movk w3, #(guestLoopIterations >> 16), lsl #16
//	2:  subs w3, w3, #1
//	    b.ne 2b
//	    strb w0, [x1]            // one loop done
//	    subs w2, w2, #1
//	    b.ne 1b
//	    strb w0, [x1, #8]        // all done
//	    b    .
func arm64GuestCode() []byte {
	var code []byte
	for _, insn := range []uint32{
		0x52800000 | arm64Value<<5,                       //nolint // register 0 (w0)                   // movz w0, #0x42
		0xD2A00000 | (arm64TickAddr>>16)<<5 | 1,          // movz x1, #0x1000, lsl #16
		0x52800000 | guestLoops<<5 | 2,                   // movz w2, #guestLoops
		0x52800000 | (guestLoopIterations&0xFFFF)<<5 | 3, // movz w3, #low16
		0x72A00000 | (guestLoopIterations>>16)<<5 | 3,    // movk w3, #high16, lsl #16
		0x71000463, // subs w3, w3, #1
		0x54FFFFE1, // b.ne -1
		0x39000020, // strb w0, [x1]
		0x71000442, // subs w2, w2, #1
		0x54FFFF41, // b.ne -6
		0x39000020 | (arm64DoneAddr-arm64TickAddr)<<10, // strb w0, [x1, #8]
		0x14000000, // b .
	} {
		code = binary.LittleEndian.AppendUint32(code, insn)
	}
	return code
}
