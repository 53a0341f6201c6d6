package accel

import (
	"bytes"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestRunChild(t *testing.T) {
	var out bytes.Buffer
	if code := runChild("bogus", "", time.Second, time.Minute, &out); code != 2 {
		t.Errorf("unknown mode: exit %d", code)
	}
	if v, _ := parseChild(out.String()); v == nil || v.Reason != ReasonKVMChildFailed {
		t.Errorf("unknown mode: %q", out.String())
	}

	out.Reset()
	missing := filepath.Join(t.TempDir(), "kvm")
	if code := runChild(KVM, missing, time.Second, time.Minute, &out); code != 0 {
		t.Errorf("missing device: exit %d", code)
	}
	v, stage := parseChild(out.String())
	want := ReasonKVMOpenFailed
	if runtime.GOOS != "linux" {
		want = ReasonNotApplicable
	} else if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		want = ReasonKVMUnsupportedArch
	}
	if v == nil || v.Reason != want || v.Works {
		t.Errorf("missing device: %q", out.String())
	}
	if runtime.GOOS == "linux" && want == ReasonKVMOpenFailed && stage != "open" {
		t.Errorf("missing device: last stage %q, want open", stage)
	}
}

func TestParseChild(t *testing.T) {
	for _, tc := range []struct {
		out, reason, stage string
	}{
		{"", "", ""},
		{"garbage\n", "", ""},
		{`{"stage":"open"}` + "\n" + `{"stage":"kvm_run"}` + "\n", "", "kvm_run"},
		{`{"stage":"open"}` + "\n" + `{"done":true,"reason":"kvm_open_failed","detail":"EACCES"}` + "\n", ReasonKVMOpenFailed, "open"},
		{`{"done":true,"works":true,"reason":"ok"}`, ReasonOK, ""},
		{`{"done":true,"works":false,"reason":"ok"}`, ReasonKVMChildFailed, ""},
		{`{"done":true}`, "", ""},
	} {
		v, stage := parseChild(tc.out)
		reason := ""
		if v != nil {
			reason = v.Reason
		}
		if reason != tc.reason || stage != tc.stage {
			t.Errorf("parseChild(%q) = %q, %q; want %q, %q", tc.out, reason, stage, tc.reason, tc.stage)
		}
	}
	if v, _ := parseChild(`{"done":true,"works":false,"reason":"ok","detail":"x"}`); !strings.Contains(v.Detail, "incoherent") {
		t.Errorf("incoherent verdict detail: %q", v.Detail)
	}
}
