package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

var ready = []string{"Pending", "Booting", "Ready"}

func TestScaleUpAndDown(t *testing.T) {
	h := newHarness(t, fastOpts())
	ids := []string{"web-1", "web-2", "web-3"}
	var set []api.DesiredInstance
	for _, id := range ids {
		set = append(set, desired(id, 1))
	}

	h.rec.SetDesired(set, false)
	for _, id := range ids {
		h.waitSeq(id, ready...)
	}
	if d := cmp.Diff(ids, h.rt.Running()); d != "" {
		t.Fatalf("running after scale up (-want +got):\n%s", d)
	}
	one := set[0].Spec.Resources()
	if got, want := h.rec.Allocated(), (api.Capacity{VCPUs: 3 * one.VCPUs, MemoryMiB: 3 * one.MemoryMiB, DiskGiB: 3 * one.DiskGiB}); got != want {
		t.Errorf("Allocated after scale up = %+v, want %+v", got, want)
	}

	// Down to one: web-2 is marked deleted, web-3 simply leaves the set.
	h.rec.SetDesired([]api.DesiredInstance{set[0], with(set[1], api.DesiredDeleted)}, false)
	gone := append(slices.Clone(ready), "Draining/terminated_by_operator", "Stopped/terminated_by_operator")
	h.waitSeq("web-2", gone...)
	h.waitSeq("web-3", gone...)
	waitFor(t, "only web-1 tracked", func() bool { return len(h.rec.Instances()) == 1 }, func() string { return "" })
	settle()

	if d := cmp.Diff([]string{"web-1"}, h.rt.Running()); d != "" {
		t.Errorf("running after scale down (-want +got):\n%s", d)
	}
	list, err := h.rt.List(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != "web-1" {
		t.Errorf("runtime holds %+v (%v), want only web-1", list, err)
	}
	for _, id := range ids {
		if n := h.rt.CallCount("create", id); n != 1 {
			t.Errorf("%s created %d times, want once", id, n)
		}
		if n := h.rt.CallCount("start", id); n != 1 {
			t.Errorf("%s started %d times, want once", id, n)
		}
		wantDestroy := 1
		if id == "web-1" {
			wantDestroy = 0
		}
		if n := h.rt.CallCount("destroy", id); n != wantDestroy {
			t.Errorf("%s destroyed %d times, want %d", id, n, wantDestroy)
		}
	}
	obs := h.rec.Instances()
	if obs[0].ID != "web-1" || obs[0].Phase != api.InstanceReady || obs[0].Name != "name-web-1" || obs[0].Runtime.Runtime != "mock" {
		t.Errorf("Instances = %+v, want web-1 Ready on mock", obs)
	}
	if got := h.rec.Allocated(); got != one {
		t.Errorf("Allocated after scale down = %+v, want %+v", got, one)
	}
	// Nothing more was reported; the deleted record is not re-created.
	h.rec.SetDesired([]api.DesiredInstance{set[0], with(set[1], api.DesiredDeleted)}, false)
	settle()
	h.waitSeq("web-1", ready...)
	h.waitSeq("web-2", gone...)
	if n := h.rt.CallCount("create", "web-2"); n != 1 {
		t.Errorf("web-2 created %d times after its deletion was re-sent, want 1", n)
	}
}

func TestStatusReportsOnlyTransitions(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }
	rt := mock.New(mock.Options{Now: clock, Log: quiet})
	opts := fastOpts()
	opts.Now = clock
	h := startHarness(t, rt, newRecorder(), opts)
	d := desired("db", 7)
	d.Spec.Network.Forwards = []api.PortForward{{Name: "ssh", GuestPort: 22, HostPort: 2222}}
	h.rec.SetDesired([]api.DesiredInstance{d}, false)
	h.waitSeq("db", ready...)
	settle() // ~20 resync ticks and a few SetDesired: no new reports
	for range 3 {
		h.rec.SetDesired([]api.DesiredInstance{d}, false)
	}
	settle()

	info := &api.InstanceRuntime{Runtime: "mock", Accel: "mock", PID: 1000, Ports: map[string]int{"ssh": 2222}, StartedAt: &at}
	want := []api.InstanceStatusReport{
		{Generation: 7, Phase: api.InstancePending, At: at},
		{Generation: 7, Phase: api.InstanceBooting, At: at, Runtime: info},
		{Generation: 7, Phase: api.InstanceReady, At: at, Runtime: info},
	}
	if diff := cmp.Diff(want, h.rep.reports("db")); diff != "" {
		t.Errorf("reports (-want +got):\n%s", diff)
	}
	if n := h.rt.CallCount("inspect", "db"); n < 10 {
		t.Errorf("only %d Inspect calls: the resync ticks did not run", n)
	}
}

func TestReporterFailsThenRecovers(t *testing.T) {
	rep := newRecorder()
	rep.setFail(func(string, api.InstanceStatusReport) error { return errors.New("control plane unavailable") })
	h := startHarness(t, mock.New(mock.Options{Log: quiet}), rep, fastOpts())
	h.rec.SetDesired([]api.DesiredInstance{desired("a", 1)}, false)

	// Every report fails until one carrying Ready was attempted.
	waitFor(t, "a failed Ready report", func() bool { return slices.Contains(rep.attemptSeq("a"), "Ready") },
		func() string { return "" })
	if got := rep.seq("a"); len(got) != 0 {
		t.Fatalf("reports succeeded while failing: %v", got)
	}
	rep.setFail(nil)
	h.waitSeq("a", "Ready") // the latest status only, no replay of Pending/Booting
	settle()
	h.waitSeq("a", "Ready")
	if got := rep.attemptSeq("a"); got[len(got)-1] != "Ready" || slices.Contains(got[slices.Index(got, "Ready"):], "Booting") {
		t.Errorf("attempts = %v, want Ready retried until it succeeded", got)
	}
}

func TestRestartAdoptsRunningInstances(t *testing.T) {
	rt := mock.New(mock.Options{Log: quiet})
	set := []api.DesiredInstance{desired("a", 1), desired("b", 1)}
	first := startHarness(t, rt, newRecorder(), fastOpts())
	first.rec.SetDesired(set, false)
	first.waitSeq("a", ready...)
	first.waitSeq("b", ready...)
	first.end()

	// A new agent process: a fresh runtime handle over the same host.
	second := startHarness(t, rt.Reopen(), newRecorder(), fastOpts())
	settle() // before the desired set arrives nothing is touched
	if n := second.rt.CallCount("destroy", "") + second.rt.CallCount("stop", ""); n != 0 {
		t.Fatalf("%d stop/destroy calls before any desired set", n)
	}
	if obs := second.rec.Instances(); len(obs) != 2 || obs[0].Phase != api.InstanceReady {
		t.Errorf("adopted instances before the desired set = %+v, want both, Ready", obs)
	}
	second.rec.SetDesired(set, false)
	second.waitSeq("a", "Ready")
	second.waitSeq("b", "Ready")
	settle()
	for _, id := range []string{"a", "b"} {
		if c, s := rt.CallCount("create", id), rt.CallCount("start", id); c != 1 || s != 1 {
			t.Errorf("%s: %d creates and %d starts, want one each (adopted)", id, c, s)
		}
	}
	if n := rt.CallCount("recover", ""); n != 2 {
		t.Errorf("Recover called %d times, want once per Run", n)
	}
	second.waitSeq("a", "Ready")
}

func TestAdoptedInstanceAbsentFromDesiredIsDestroyed(t *testing.T) {
	rt := mock.New(mock.Options{Log: quiet})
	ctx := context.Background()
	for _, spec := range []runtime.Spec{
		ToRuntimeSpec(desired("orphan", 1), nil),
		{ID: "slice-vm", Owner: "slice", Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 64}},
	} {
		if _, err := rt.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Start(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
	}
	h := startHarness(t, rt, newRecorder(), fastOpts())
	h.rec.SetDesired(nil, false)
	h.waitSeq("orphan", "Draining/terminated_by_operator", "Stopped/terminated_by_operator")
	waitFor(t, "orphan forgotten", func() bool { return len(h.rec.Instances()) == 0 }, func() string { return "" })
	if d := cmp.Diff([]string{"slice-vm"}, rt.Running()); d != "" {
		t.Errorf("running (-want +got):\n%s (another owner's instance must be left alone)", d)
	}
}

func TestGenerationChange(t *testing.T) {
	h := newHarness(t, fastOpts())
	d1 := desired("a", 1)
	h.rec.SetDesired([]api.DesiredInstance{d1}, false)
	h.waitSeq("a", ready...)

	// A new generation that changes only reconciler-side settings keeps
	// the instance and reports the new generation.
	d2 := d1
	d2.Generation = 2
	d2.Spec.HealthCheck = &api.HealthCheck{Interval: api.Duration(5 * time.Millisecond)}
	h.rec.SetDesired([]api.DesiredInstance{d2}, false)
	h.waitSeq("a", "Pending", "Booting", "Ready", "Ready")
	if n := h.rt.CallCount("create", "a"); n != 1 {
		t.Fatalf("created %d times after a reconciler-only change, want 1", n)
	}

	// A new generation with another runtime spec recreates it.
	d3 := d2
	d3.Generation = 3
	d3.Spec.MemoryMiB = 512
	h.rec.SetDesired([]api.DesiredInstance{d3}, false)
	h.waitSeq("a", "Pending", "Booting", "Ready", "Ready", "Pending", "Booting", "Ready")
	reps := h.rep.reports("a")
	for i, wantGen := range []int64{1, 1, 1, 2, 3, 3, 3} {
		if reps[i].Generation != wantGen {
			t.Errorf("report %d generation = %d, want %d", i, reps[i].Generation, wantGen)
		}
	}
	st, err := h.rt.Inspect(context.Background(), "a")
	if err != nil || st.Spec.Resources.MemoryMiB != 512 || st.State != runtime.StateRunning {
		t.Errorf("after recreate: %+v, %v; want running with 512 MiB", st, err)
	}
	var ops []string
	for _, c := range h.rt.Calls() {
		if c.ID == "a" && c.Op != "inspect" && c.Op != "probe" {
			ops = append(ops, c.Op)
		}
	}
	if d := cmp.Diff([]string{"create", "start", "stop", "destroy", "create", "start"}, ops); d != "" {
		t.Errorf("runtime calls (-want +got):\n%s", d)
	}
}

func TestSlowStopDoesNotBlockOthers(t *testing.T) {
	h := newHarness(t, fastOpts())
	slow := desired("slow", 1)
	slow.Spec.GracefulTimeout = api.Duration(time.Hour)
	h.rt.SetBehavior("slow", mock.Behavior{IgnoreStop: true})
	h.rec.SetDesired([]api.DesiredInstance{slow}, false)
	h.waitSeq("slow", ready...)

	h.rec.SetDesired([]api.DesiredInstance{with(slow, api.DesiredStopped), desired("fast", 1)}, false)
	h.waitSeq("fast", ready...)
	h.waitSeq("slow", "Pending", "Booting", "Ready", "Draining/terminated_by_operator")
	obs := h.rec.Instances()
	if len(obs) != 2 || obs[1].ID != "slow" || obs[1].Phase != api.InstanceDraining {
		t.Errorf("Instances = %+v, want slow Draining", obs)
	}
	// Ending Run interrupts the hour-long stop (the harness checks Run
	// returns promptly, goleak that nothing is left behind).
	h.end()
}

func TestSecretsReachTheRuntime(t *testing.T) {
	rt := &captureRT{Runtime: mock.New(mock.Options{Log: quiet})}
	opts := fastOpts()
	opts.Secrets = func(_ context.Context, id string, names []string) (map[string][]byte, error) {
		if id != "a" {
			return nil, fmt.Errorf("secrets asked for instance %q", id)
		}
		out := map[string][]byte{}
		for _, name := range names {
			out[name] = []byte("value-of-" + name)
		}
		return out, nil
	}
	rep := newRecorder()
	rec := New(rt, rep, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- rec.Run(ctx) }()
	defer func() { cancel(); <-done }()

	d := desired("a", 1)
	d.Spec.Secrets = []string{"db-password", "api-token"}
	rec.SetDesired([]api.DesiredInstance{d}, false)
	waitFor(t, "Ready", func() bool { return slices.Equal(rep.seq("a"), ready) }, func() string { return "" })
	want := map[string][]byte{"db-password": []byte("value-of-db-password"), "api-token": []byte("value-of-api-token")}
	if diff := cmp.Diff(want, rt.lastSecrets()); diff != "" {
		t.Errorf("secrets passed to Create (-want +got):\n%s", diff)
	}
}

// captureRT records the secrets each Create was given.
type captureRT struct {
	*mock.Runtime
	mu      sync.Mutex
	secrets map[string][]byte
}

func (c *captureRT) Create(ctx context.Context, s runtime.Spec) (runtime.Status, error) {
	c.mu.Lock()
	c.secrets = s.Secrets
	c.mu.Unlock()
	return c.Runtime.Create(ctx, s)
}

func (c *captureRT) lastSecrets() map[string][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.secrets
}

func TestToRuntimeSpec(t *testing.T) {
	d := desired("a", 4)
	d.Spec.Boot = &api.DirectBoot{Kernel: api.Artifact{URL: "file:///k", SHA256: "cd"}, Cmdline: "console=ttyS0"}
	d.Spec.CloudInit = &api.CloudInit{Hostname: "a"}
	d.Spec.Network = api.NetworkSpec{Mode: api.NetworkUser, Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22}}}
	d.Spec.HealthCheck = &api.HealthCheck{FailureThreshold: 2}
	d.PCIDevices = []string{"0000:17:00.0", "0000:18:00.2"}
	secrets := map[string][]byte{"s": []byte("x")}
	got := ToRuntimeSpec(d, secrets)
	want := runtime.Spec{
		ID: "a", Image: runtime.DiskImage(d.Spec.Image), Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 256, DiskGiB: 2},
		Ports: d.Spec.Network.Forwards, Readiness: runtime.Readiness{Readiness: d.Spec.Readiness, HealthCheck: d.Spec.HealthCheck},
		Secrets: secrets, Owner: Owner, Devices: runtime.Devices{PCI: d.PCIDevices},
		VM: &runtime.VMSpec{Boot: d.Spec.Boot, Network: runtime.VMNetwork{Mode: api.NetworkUser}, CloudInit: d.Spec.CloudInit},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ToRuntimeSpec (-want +got):\n%s", diff)
	}
}

// TestToRuntimeSpecMatchesLegacySpecJSON: the flat spec.json an agent
// before the VM section persisted for a desired instance decodes to the
// spec ToRuntimeSpec builds now, so an upgraded agent sees no spec change
// (specChanged) and recreates nothing.
func TestToRuntimeSpecMatchesLegacySpecJSON(t *testing.T) {
	d := desired("a", 4)
	d.Spec.Boot = &api.DirectBoot{Kernel: api.Artifact{URL: "file:///k", SHA256: "cd"}, Cmdline: "console=ttyS0"}
	d.Spec.CloudInit = &api.CloudInit{Hostname: "a", User: "ops"}
	d.Spec.Network = api.NetworkSpec{Mode: api.NetworkUser, Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22}}, MAC: "52:54:00:00:00:01"}
	d.Spec.HealthCheck = &api.HealthCheck{FailureThreshold: 2}
	d.PCIDevices = []string{"0000:17:00.0"}
	legacy := `{
  "id": "a",
  "image": {"url": "file:///images/tiny.qcow2", "sha256": "ab"},
  "disk_gib": 2,
  "boot": {"kernel": {"url": "file:///k", "sha256": "cd"}, "cmdline": "console=ttyS0"},
  "vcpus": 1,
  "memory_mib": 256,
  "network": {"mode": "user", "forwards": [{"name": "ssh", "guest_port": 22}], "mac": "52:54:00:00:00:01"},
  "cloud_init": {"hostname": "a", "user": "ops"},
  "readiness": {"timeout": "2s"},
  "pci_devices": ["0000:17:00.0"],
  "owner": "reconciler"
}`
	var have runtime.Spec
	if err := json.Unmarshal([]byte(legacy), &have); err != nil {
		t.Fatal(err)
	}
	w := &worker{st: runtime.Status{Spec: have}}
	if w.specChanged(d) {
		want, _ := json.Marshal(ToRuntimeSpec(d, nil))
		got, _ := json.Marshal(have)
		t.Errorf("a legacy spec.json reads as a changed spec:\nwant %s\nhave %s", want, got)
	}
}

// An instance adopted while still booting gets its full readiness timeout
// from the moment it is adopted; it is not restarted at once.
func TestAdoptedBootingInstanceKeepsBooting(t *testing.T) {
	rt := mock.New(mock.Options{Log: quiet})
	rt.SetBehavior("a", mock.Behavior{NeverReady: true})
	set := []api.DesiredInstance{desired("a", 1)}
	first := startHarness(t, rt, newRecorder(), fastOpts())
	first.rec.SetDesired(set, false)
	first.waitSeq("a", "Pending", "Booting")
	first.end()

	second := startHarness(t, rt.Reopen(), newRecorder(), fastOpts())
	second.rec.SetDesired(set, false)
	second.waitSeq("a", "Booting")
	settle()
	if n := rt.CallCount("stop", "a"); n != 0 {
		t.Errorf("adopted booting instance stopped %d times, want none before its readiness timeout", n)
	}
	if got := second.rep.seq("a"); !slices.Equal(got, []string{"Booting"}) {
		t.Errorf("reports after adoption = %v, want [Booting]", got)
	}
}
