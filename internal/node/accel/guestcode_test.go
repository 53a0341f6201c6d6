package accel

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// The expected encodings come from GNU as/objdump (x86) and go tool objdump
// -gnu (arm64).
func TestGuestCode(t *testing.T) {
	x86 := []byte{
		0xbb, 0x14, 0x00, 0x00, 0x00, // mov $0x14,%ebx
		0xb9, 0x40, 0x42, 0x0f, 0x00, // mov $0xf4240,%ecx
		0xff, 0xc9, // dec %ecx
		0x75, 0xfc, // jne 0xa
		0xb0, 0x42, // mov $0x42,%al
		0xe6, 0x10, // out %al,$0x10
		0xff, 0xcb, // dec %ebx
		0x75, 0xef, // jne 0x5
		0xe6, 0x11, // out %al,$0x11
		0xf4, // hlt
	}
	if got := x86GuestCode(); !bytes.Equal(got, x86) {
		t.Errorf("x86GuestCode = % x\nwant            % x", got, x86)
	}
	var arm64 []byte
	for _, w := range []uint32{0x52800840, 0xd2a20001, 0x52800282, 0x52884803, 0x72a001e3, 0x71000463,
		0x54ffffe1, 0x39000020, 0x71000442, 0x54ffff41, 0x39002020, 0x14000000} {
		arm64 = binary.LittleEndian.AppendUint32(arm64, w)
	}
	if got := arm64GuestCode(); !bytes.Equal(got, arm64) {
		t.Errorf("arm64GuestCode = % x\nwant             % x", got, arm64)
	}
}
