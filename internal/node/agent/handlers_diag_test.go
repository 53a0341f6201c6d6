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
