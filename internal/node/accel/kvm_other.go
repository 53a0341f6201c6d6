//go:build !linux

package accel

import (
	"runtime"
	"time"
)

// kvmProof: KVM is linux only.
func kvmProof(string, time.Duration, func(string)) (bool, string, string) {
	return false, ReasonNotApplicable, "kvm is linux only, this is " + runtime.GOOS
}
