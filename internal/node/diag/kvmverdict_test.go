package diag

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestKVMVerdictAgreement: the kvm check, its progress event, healthy and
// the result's status agree with the accelerator probe's verdict. Before
// the fix an openable /dev/kvm whose guest ran ~500x slow (this development
// machine's kvm-pvm) gave "kvm succeeded" while the accelerator probe said
// kvm_guest_too_slow.
func TestKVMVerdictAgreement(t *testing.T) {
	allVFIO := "vfio_pci 16384 0 - Live 0x0\nvfio 45056 2 vfio_pci, Live 0x0\n"
	tests := []struct {
		name        string
		kvmDev      bool
		verdict     *KVMVerdict // nil: no accelerator verdict yet
		wantOK      bool
		wantReason  string
		wantHealthy bool
	}{
		{name: "no verdict, device openable", kvmDev: true, wantOK: true, wantHealthy: true},
		{name: "kvm works", kvmDev: true, verdict: &KVMVerdict{Works: true, Reason: "ok"}, wantOK: true, wantHealthy: true},
		{name: "guest too slow", kvmDev: true,
			verdict:    &KVMVerdict{Reason: "kvm_guest_too_slow", Detail: "guest ran 512x slower than expected"},
			wantReason: "kvm_guest_too_slow"},
		{name: "guest hung", kvmDev: true, verdict: &KVMVerdict{Reason: "kvm_guest_hung"}, wantReason: "kvm_guest_hung"},
		{name: "device missing wins", verdict: &KVMVerdict{Reason: "kvm_device_missing"}, wantReason: ReasonKVMMissing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			roots := fakeHost{osrelease: "6.8.0", meminfo: gpuHostMeminfo, modules: strPtr(allVFIO),
				sysModules: []string{"vfio_iommu_type1"}, kvm: tt.kvmDev}.build(t)
			p := newTestProber(t, roots, "linux")
			if tt.verdict != nil {
				v := *tt.verdict
				p.cfg.KVMVerdict = func() (KVMVerdict, bool) { return v, true }
			}
			events := map[string]error{}
			res, err := p.Handle(context.Background(), nil, func(phase string, _ time.Duration, err error) { events[phase] = err })
			if err != nil || res.Status != "succeeded" {
				t.Fatalf("Handle = %+v, %v (an unhealthy host is still a succeeded probe)", res, err)
			}
			var rep Report
			if err := json.Unmarshal(res.Output, &rep); err != nil {
				t.Fatal(err)
			}
			c := checksByName(rep)[PhaseKVM]
			if c.OK != tt.wantOK || (!tt.wantOK && c.Reason != tt.wantReason) {
				t.Errorf("kvm check = %+v, want ok=%v reason %q", c, tt.wantOK, tt.wantReason)
			}
			if rep.Healthy != tt.wantHealthy {
				t.Errorf("healthy = %v, want %v (checks %+v)", rep.Healthy, tt.wantHealthy, rep.Checks)
			}
			// The summary agrees with the checks: healthy iff every check is
			// OK, and each phase's event failed iff its check did.
			if rep.Healthy != healthy(rep.Checks) {
				t.Errorf("healthy %v disagrees with checks %+v", rep.Healthy, rep.Checks)
			}
			for _, ch := range rep.Checks {
				var ce *CheckError
				failed := errors.As(events[ch.Name], &ce)
				if failed == ch.OK {
					t.Errorf("phase %s: event err %v, check %+v", ch.Name, events[ch.Name], ch)
				}
			}
			if !tt.wantOK && tt.kvmDev && (rep.KVM.Error == "" || !rep.KVM.Openable) {
				t.Errorf("kvm status = %+v, want openable with the verdict as error", rep.KVM)
			}
		})
	}
}
