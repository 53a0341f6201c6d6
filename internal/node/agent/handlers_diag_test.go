package agent

import (
	"testing"

	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/diag"
)

func TestKVMVerdict(t *testing.T) {
	slow := accel.Result{Accelerators: []accel.Status{
		{Name: accel.KVM, Reason: accel.ReasonKVMGuestTooSlow, Detail: "512x"},
		{Name: accel.TCG, Works: true, Reason: accel.ReasonOK},
	}}
	tests := []struct {
		name   string
		res    accel.Result
		cached bool
		want   diag.KVMVerdict
		wantOK bool
	}{
		{"not probed yet", accel.Result{}, false, diag.KVMVerdict{}, false},
		{"no kvm status", accel.Result{Accelerators: []accel.Status{{Name: accel.TCG, Works: true}}}, true, diag.KVMVerdict{}, false},
		{"too slow", slow, true, diag.KVMVerdict{Reason: accel.ReasonKVMGuestTooSlow, Detail: "512x"}, true},
		{"works", accel.Result{Accelerators: []accel.Status{{Name: accel.KVM, Works: true, Reason: accel.ReasonOK}}}, true,
			diag.KVMVerdict{Works: true, Reason: accel.ReasonOK}, true},
	}
	for _, tt := range tests {
		got, ok := kvmVerdict(tt.res, tt.cached)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("%s: kvmVerdict = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestOtherAccel: the health probe holds a broken KVM against a host only
// when the host runs its VMs with KVM: configured so (even with a TCG
// fallback), or picked by the agent's accelerator probe.
func TestOtherAccel(t *testing.T) {
	kvmWorks := accel.Result{Accelerators: []accel.Status{{Name: accel.KVM, Works: true}, {Name: accel.TCG, Works: true}}}
	kvmSlow := accel.Result{Accelerators: []accel.Status{{Name: accel.KVM, Works: false, Reason: "kvm_guest_too_slow"}, {Name: accel.TCG, Works: true}}}
	for _, c := range []struct {
		name       string
		configured string
		res        accel.Result
		probed     bool
		want       string
	}{
		{"configured tcg", "tcg", kvmSlow, true, "tcg"},
		{"configured nvmm", "nvmm", accel.Result{}, false, "nvmm"},
		{"configured kvm, broken: ill health", "kvm", kvmSlow, true, ""},
		{"auto, kvm works", "", kvmWorks, true, ""},
		{"auto, kvm broken: the probe picked tcg", "", kvmSlow, true, "tcg"},
		{"auto, not probed yet", "", accel.Result{}, false, ""},
		{"auto, nothing works", "", accel.Result{Accelerators: []accel.Status{{Name: accel.KVM}, {Name: accel.TCG}}}, true, ""},
	} {
		if got := otherAccel(c.configured, c.res, c.probed); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
