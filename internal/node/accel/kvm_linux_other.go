//go:build linux && !amd64 && !arm64

package accel

const guestDescription = ""

// newKVMGuest: there is no probe guest for this architecture.
func newKVMGuest() kvmGuest { return nil }
