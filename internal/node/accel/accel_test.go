package accel

import (
	"errors"
	"testing"
)

func testResult() Result {
	return Result{
		Accelerators: []Status{
			{Name: KVM, Reason: ReasonKVMGuestHung, Detail: "no verdict within 3s"},
			{Name: NVMM, Reason: ReasonNotApplicable, Detail: "nvmm is dragonfly only"},
			{Name: HVF, Reason: ReasonNotApplicable, Detail: "hvf is darwin only"},
			{Name: TCG, Works: true, Reason: ReasonOK},
		},
		Working: []string{TCG},
	}
}

func TestSelect(t *testing.T) {
	res := testResult()
	for _, tc := range []struct {
		selected    string
		want        string // "" for no error
		unsupported bool
		unknown     bool
	}{
		{selected: ""},
		{selected: TCG},
		{selected: KVM, unsupported: true,
			want: "selected_accel not supported by host: kvm (kvm_guest_hung: no verdict within 3s)"},
		{selected: NVMM, unsupported: true,
			want: "selected_accel not supported by host: nvmm (not_applicable: nvmm is dragonfly only)"},
		{selected: "whpx", unknown: true, want: `unknown accelerator "whpx": valid values are kvm, nvmm, hvf, tcg`},
		{selected: "KVM", unknown: true, want: `unknown accelerator "KVM": valid values are kvm, nvmm, hvf, tcg`},
	} {
		err := Select(res, tc.selected)
		if tc.want == "" {
			if err != nil {
				t.Errorf("Select(%q) = %v, want nil", tc.selected, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.want {
			t.Errorf("Select(%q) = %v, want %q", tc.selected, err, tc.want)
			continue
		}
		var ue *UnsupportedError
		if errors.As(err, &ue) != tc.unsupported {
			t.Errorf("Select(%q): *UnsupportedError %v, want %v", tc.selected, !tc.unsupported, tc.unsupported)
		} else if tc.unsupported && (ue.Name != tc.selected || ue.Reason == "") {
			t.Errorf("Select(%q): %+v", tc.selected, ue)
		}
		var ke *UnknownError
		if errors.As(err, &ke) != tc.unknown {
			t.Errorf("Select(%q): *UnknownError %v, want %v", tc.selected, !tc.unknown, tc.unknown)
		}
	}
	// A Result without a verdict on the selection refuses it too.
	err := Select(Result{}, HVF)
	var ue *UnsupportedError
	if !errors.As(err, &ue) || ue.Reason != ReasonNotProbed {
		t.Errorf("Select(empty, hvf) = %v", err)
	}
}

func TestDefault(t *testing.T) {
	res := testResult()
	if got := Default(res); got != TCG {
		t.Errorf("Default = %q, want tcg", got)
	}
	res.Accelerators[0].Works, res.Accelerators[0].Reason = true, ReasonOK
	if got := Default(res); got != KVM {
		t.Errorf("Default = %q, want kvm", got)
	}
	if got := Default(Result{}); got != "" {
		t.Errorf("Default(empty) = %q", got)
	}
	for i := range res.Accelerators {
		res.Accelerators[i].Works = false
	}
	if got := Default(res); got != "" {
		t.Errorf("Default(none working) = %q", got)
	}
}
