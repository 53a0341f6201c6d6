package accel

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHost is a host made of a temporary /dev, a PATH of fake binaries, a
// runner that answers for them and a fake KVM child.
type fakeHost struct {
	t        *testing.T
	root     string
	devices  []string          // created under dev/ (a directory when the name ends in /)
	binaries []string          // found by LookPath
	outputs  map[string]string // runner output by "name args..." (base name of the program)
	failures map[string]error  // runner errors, likewise
	child    string            // the KVM child's output (testChildEnv); "" for no child
	log      *callLog
}

// callLog records the runner's calls.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (h *fakeHost) config(goos, goarch string) Config {
	h.t.Helper()
	if h.root == "" {
		h.root = h.t.TempDir()
	}
	dev, bin := filepath.Join(h.root, "dev"), filepath.Join(h.root, "bin")
	for _, d := range []string{dev, bin, filepath.Join(h.root, "proc/sys/kernel/random")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			h.t.Fatal(err)
		}
	}
	for _, d := range h.devices {
		p := filepath.Join(dev, d)
		if strings.HasSuffix(d, "/") {
			os.MkdirAll(p, 0o755)
		} else if err := os.WriteFile(p, nil, 0o600); err != nil {
			h.t.Fatal(err)
		}
	}
	for _, b := range h.binaries {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/false\n"), 0o755); err != nil {
			h.t.Fatal(err)
		}
	}
	h.setBootID("boot-1")
	h.log = &callLog{}
	return Config{
		GOOS: goos, GOARCH: goarch, DevRoot: dev, ProcRoot: filepath.Join(h.root, "proc"),
		LookPath: func(file string) (string, error) {
			if slices.Contains(h.binaries, file) {
				return filepath.Join(bin, file), nil
			}
			return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
		},
		Run: func(ctx context.Context, name string, args ...string) ([]byte, error) {
			call := strings.Join(append([]string{filepath.Base(name)}, args...), " ")
			h.log.mu.Lock()
			h.log.calls = append(h.log.calls, call)
			h.log.mu.Unlock()
			if err := h.failures[call]; err != nil {
				return nil, err
			}
			out, ok := h.outputs[call]
			if !ok {
				return nil, errors.New("fake host: no such program " + call)
			}
			return []byte(out), nil
		},
		Timeout:  2 * time.Second,
		KVMChild: func() (*exec.Cmd, error) { return fakeChild(h.t, h.child), nil },
	}
}

func (h *fakeHost) setBootID(id string) {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.root, "proc/sys/kernel/random/boot_id"), []byte(id+"\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) callCount() int {
	h.log.mu.Lock()
	defer h.log.mu.Unlock()
	return len(h.log.calls)
}

// fakeChild is this test binary printing out (or sleeping for "sleep").
func fakeChild(t *testing.T, out string) *exec.Cmd {
	if out == "" {
		t.Error("the KVM child was started but the test gave it nothing to say")
		out = `{"done":true,"reason":"kvm_child_failed","detail":"unexpected child"}`
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), testChildEnv+"="+out)
	return cmd
}

const (
	helpTCGKVM = "Accelerators supported in QEMU binary:\ntcg\nkvm\n"
	childOK    = `{"stage":"kvm_run"}` + "\n" + `{"done":true,"works":true,"reason":"ok","detail":"fake guest ran"}`
)

func TestProbeHosts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		goos    string
		goarch  string
		host    fakeHost
		want    map[string]string // name -> reason
		detail  map[string]string // name -> substring of Detail
		working []string
	}{
		{
			name: "linux bare", goos: "linux", goarch: "amd64",
			want:    map[string]string{KVM: ReasonKVMDeviceMissing, NVMM: ReasonNotApplicable, HVF: ReasonNotApplicable, TCG: ReasonQEMUMissing},
			detail:  map[string]string{TCG: "qemu-system-x86_64 not found"},
			working: []string{},
		},
		{
			name: "linux kvm and tcg", goos: "linux", goarch: "amd64",
			host: fakeHost{devices: []string{"kvm"}, binaries: []string{"qemu-system-x86_64"},
				outputs: map[string]string{"qemu-system-x86_64 -accel help": helpTCGKVM}, child: childOK},
			want:    map[string]string{KVM: ReasonOK, TCG: ReasonOK},
			detail:  map[string]string{KVM: "fake guest ran; qemu: ", TCG: "lists tcg, kvm"},
			working: []string{KVM, TCG},
		},
		{
			name: "linux arm64 qemu name", goos: "linux", goarch: "arm64",
			host: fakeHost{devices: []string{"kvm"}, binaries: []string{"qemu-system-aarch64"},
				outputs: map[string]string{"qemu-system-aarch64 -accel help": helpTCGKVM}, child: childOK},
			want:    map[string]string{KVM: ReasonOK, TCG: ReasonOK},
			working: []string{KVM, TCG},
		},
		{
			name: "linux qemu without kvm", goos: "linux", goarch: "amd64",
			host: fakeHost{devices: []string{"kvm"}, binaries: []string{"qemu-system-x86_64"},
				outputs: map[string]string{"qemu-system-x86_64 -accel help": "Accelerators supported in QEMU binary:\ntcg\n"}, child: childOK},
			want:    map[string]string{KVM: ReasonQEMUAccelMissing, TCG: ReasonOK},
			detail:  map[string]string{KVM: "kvm is not in QEMU's accelerators"},
			working: []string{TCG},
		},
		{
			name: "linux qemu fails", goos: "linux", goarch: "amd64",
			host: fakeHost{devices: []string{"kvm"}, binaries: []string{"qemu-system-x86_64"},
				failures: map[string]error{"qemu-system-x86_64 -accel help": errors.New("exit status 1")}, child: childOK},
			want:    map[string]string{KVM: ReasonOK, TCG: ReasonQEMUFailed},
			detail:  map[string]string{TCG: "exit status 1"},
			working: []string{KVM},
		},
		{
			name: "linux kvm not openable", goos: "linux", goarch: "amd64",
			host: fakeHost{devices: []string{"kvm/"}},
			want: map[string]string{KVM: ReasonKVMOpenFailed, TCG: ReasonQEMUMissing},
		},
		{
			name: "linux kvm too slow", goos: "linux", goarch: "amd64",
			host: fakeHost{devices: []string{"kvm"},
				child: `{"done":true,"reason":"kvm_guest_too_slow","detail":"2 of 10 loops in 1s"}`},
			want:   map[string]string{KVM: ReasonKVMGuestTooSlow},
			detail: map[string]string{KVM: "2 of 10 loops"},
		},
		{
			name: "linux child without verdict", goos: "linux", goarch: "amd64",
			host:   fakeHost{devices: []string{"kvm"}, child: "panic: not a verdict"},
			want:   map[string]string{KVM: ReasonKVMChildFailed},
			detail: map[string]string{KVM: "MaybeRunChild"},
		},
		{
			name: "linux child incoherent", goos: "linux", goarch: "amd64",
			host: fakeHost{devices: []string{"kvm"}, child: `{"done":true,"works":true,"reason":"kvm_run_failed"}`},
			want: map[string]string{KVM: ReasonKVMChildFailed},
		},
		{
			name: "linux no guest for arch", goos: "linux", goarch: "riscv64",
			host:   fakeHost{devices: []string{"kvm"}},
			want:   map[string]string{KVM: ReasonKVMUnsupportedArch, TCG: ReasonQEMUMissing},
			detail: map[string]string{TCG: "qemu-system-riscv64"},
		},
		{
			name: "dragonfly nvmm", goos: "dragonfly", goarch: "amd64",
			host: fakeHost{devices: []string{"nvmm", "kvm"}, binaries: []string{"qemu-system-x86_64"},
				outputs: map[string]string{"qemu-system-x86_64 -accel help": "Accelerators supported in QEMU binary:\ntcg\nnvmm\n"}},
			want:    map[string]string{KVM: ReasonNotApplicable, NVMM: ReasonOK, HVF: ReasonNotApplicable, TCG: ReasonOK},
			working: []string{NVMM, TCG},
		},
		{
			name: "dragonfly no nvmm", goos: "dragonfly", goarch: "amd64",
			want: map[string]string{NVMM: ReasonNVMMDeviceMissing, TCG: ReasonQEMUMissing},
		},
		{
			name: "dragonfly nvmm not openable", goos: "dragonfly", goarch: "amd64",
			host: fakeHost{devices: []string{"nvmm/"}},
			want: map[string]string{NVMM: ReasonNVMMOpenFailed},
		},
		{
			name: "dragonfly qemu without nvmm", goos: "dragonfly", goarch: "amd64",
			host: fakeHost{devices: []string{"nvmm"}, binaries: []string{"qemu-system-x86_64"},
				outputs: map[string]string{"qemu-system-x86_64 -accel help": "Accelerators supported in QEMU binary:\ntcg\n"}},
			want:    map[string]string{NVMM: ReasonQEMUAccelMissing, TCG: ReasonOK},
			working: []string{TCG},
		},
		{
			name: "darwin hvf", goos: "darwin", goarch: "arm64",
			host: fakeHost{binaries: []string{"qemu-system-aarch64"}, outputs: map[string]string{
				"sysctl -n kern.hv_support":       "1\n",
				"qemu-system-aarch64 -accel help": "Accelerators supported in QEMU binary:\ntcg\nhvf\n"}},
			want:    map[string]string{KVM: ReasonNotApplicable, NVMM: ReasonNotApplicable, HVF: ReasonOK, TCG: ReasonOK},
			working: []string{HVF, TCG},
		},
		{
			name: "darwin no hv support", goos: "darwin", goarch: "amd64",
			host:   fakeHost{outputs: map[string]string{"sysctl -n kern.hv_support": "0\n"}},
			want:   map[string]string{HVF: ReasonHVFUnsupported, TCG: ReasonQEMUMissing},
			detail: map[string]string{HVF: `kern.hv_support is "0"`},
		},
		{
			name: "darwin sysctl fails", goos: "darwin", goarch: "arm64",
			host: fakeHost{failures: map[string]error{"sysctl -n kern.hv_support": errors.New("unknown oid")}},
			want: map[string]string{HVF: ReasonHVFProbeFailed},
		},
		{
			name: "windows tcg", goos: "windows", goarch: "amd64",
			host: fakeHost{binaries: []string{"qemu-system-x86_64"}, outputs: map[string]string{
				"qemu-system-x86_64 -accel help": "Accelerators supported in QEMU binary:\ntcg\nwhpx\n"}},
			want:    map[string]string{KVM: ReasonNotApplicable, NVMM: ReasonNotApplicable, HVF: ReasonNotApplicable, TCG: ReasonOK},
			detail:  map[string]string{KVM: "whpx (listed by QEMU) is not probed"},
			working: []string{TCG},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.host.t = t
			p := New(tc.host.config(tc.goos, tc.goarch))
			res, err := p.Probe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			checkCoherent(t, res)
			for name, reason := range tc.want {
				s, _ := res.Status(name)
				if s.Reason != reason {
					t.Errorf("%s: reason %q (%s), want %q", name, s.Reason, s.Detail, reason)
				}
			}
			for name, sub := range tc.detail {
				if s, _ := res.Status(name); !strings.Contains(s.Detail, sub) {
					t.Errorf("%s: detail %q does not contain %q", name, s.Detail, sub)
				}
			}
			if tc.working != nil && !slices.Equal(res.Working, tc.working) {
				t.Errorf("working %v, want %v", res.Working, tc.working)
			}
			if (tc.goos == "linux") != (res.BootID != "") {
				t.Errorf("boot id %q on %s", res.BootID, tc.goos)
			}
		})
	}
}

// checkCoherent checks what every Result must satisfy.
func checkCoherent(t *testing.T, res Result) {
	t.Helper()
	if len(res.Accelerators) != len(Names()) {
		t.Fatalf("%d statuses, want %d", len(res.Accelerators), len(Names()))
	}
	var working []string
	for i, s := range res.Accelerators {
		if s.Name != Names()[i] {
			t.Errorf("status %d is %q, want %q", i, s.Name, Names()[i])
		}
		if s.Reason == "" || s.Works != (s.Reason == ReasonOK) {
			t.Errorf("%s: incoherent %+v", s.Name, s)
		}
		if s.Works {
			working = append(working, s.Name)
		}
	}
	if !slices.Equal(working, res.Working) || res.Working == nil {
		t.Errorf("Working %v, want %v", res.Working, working)
	}
	if res.ProbedAt.IsZero() {
		t.Error("no ProbedAt")
	}
}

// A child whose guest never finishes is killed at the timeout.
func TestProbeKVMChildHangs(t *testing.T) {
	h := fakeHost{t: t, devices: []string{"kvm"}, child: "sleep"}
	cfg := h.config("linux", "amd64")
	cfg.Timeout = 500 * time.Millisecond
	start := time.Now()
	res, err := New(cfg).Probe(context.Background())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := res.Status(KVM)
	if s.Reason != ReasonKVMGuestHung || s.Works {
		t.Errorf("kvm: %+v, want %s", s, ReasonKVMGuestHung)
	}
	if !strings.Contains(s.Detail, `last stage "kvm_run"`) {
		t.Errorf("detail %q does not name the last stage", s.Detail)
	}
	if took > cfg.Timeout+time.Second {
		t.Errorf("probe took %s with timeout %s", took, cfg.Timeout)
	}
	t.Logf("hung child: %s in %s", s.Detail, took)
}

func TestProbeCanceled(t *testing.T) {
	h := fakeHost{t: t, devices: []string{"kvm"}, child: "sleep"}
	cfg := h.config("linux", "amd64")
	cfg.CacheDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := New(cfg).Probe(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Probe = %v, want deadline exceeded", err)
	}
	if took := time.Since(start); took > time.Second+200*time.Millisecond {
		t.Errorf("canceled probe took %s", took)
	}
	if _, err := os.Stat(filepath.Join(cfg.CacheDir, CacheFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a canceled probe was cached: %v", err)
	}
}

// A probe child must not start probe children (a binary whose main forgot
// MaybeRunChild would otherwise multiply).
func TestProbeInsideChild(t *testing.T) {
	t.Setenv(ChildEnv, "kvm")
	h := fakeHost{t: t, devices: []string{"kvm"}}
	res, err := New(h.config("linux", "amd64")).Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := res.Status(KVM); s.Reason != ReasonKVMChildFailed {
		t.Errorf("kvm: %+v", s)
	}
}

func TestParseAccelHelp(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want []string
	}{
		{helpTCGKVM, []string{"tcg", "kvm"}},
		{"Accelerators supported in QEMU binary:\r\ntcg\r\nwhpx\r\n", []string{"tcg", "whpx"}},
		{"", nil},
		{"qemu-system-x86_64: -accel help: invalid option\n", nil},
	} {
		if got := parseAccelHelp([]byte(tc.out)); !slices.Equal(got, tc.want) {
			t.Errorf("parseAccelHelp(%q) = %v, want %v", tc.out, got, tc.want)
		}
	}
}

func TestQEMUBinary(t *testing.T) {
	for goarch, want := range map[string]string{"amd64": "qemu-system-x86_64", "arm64": "qemu-system-aarch64",
		"riscv64": "qemu-system-riscv64", "mips64": "qemu-system-mips64"} {
		if got := QEMUBinary(goarch); got != want {
			t.Errorf("QEMUBinary(%s) = %s, want %s", goarch, got, want)
		}
	}
}

func TestKVMBudget(t *testing.T) {
	if got := KVMBudget(3 * time.Second); got != time.Second {
		t.Errorf("KVMBudget(3s) = %s", got)
	}
	if got := KVMBudget(time.Second); got != 500*time.Millisecond {
		t.Errorf("KVMBudget(1s) = %s", got)
	}
}
