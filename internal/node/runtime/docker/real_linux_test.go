package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker/dockertest"
	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/api"
)

// rig is the engine, registry and images every real test shares (TestMain).
type rig struct {
	engine *dockertest.Engine
	reg    *dockertest.Registry
	server string // the testserver binary
	app    dockertest.Image
	other  dockertest.Image
	bb     dockertest.Image
	err    error
}

// shared is set once by TestMain and read by the tests.
var shared *rig

func TestMain(m *testing.M) {
	r := &rig{}
	if dockertest.Unavailable() == "" {
		r.err = r.setUp()
	}
	shared = r
	code := m.Run()
	if r.engine != nil {
		r.engine.Close()
	}
	if r.reg != nil {
		r.reg.Close()
	}
	if r.server != "" {
		os.RemoveAll(strings.TrimSuffix(r.server, "/testserver"))
	}
	os.Exit(code)
}

func (r *rig) setUp() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r.reg = dockertest.StartRegistry()
	dir, err := os.MkdirTemp("", "drover-testserver")
	if err != nil {
		return err
	}
	if r.server, err = dockertest.BuildTestServer(ctx, dir); err != nil {
		return err
	}
	if r.app, err = r.reg.Push("drover/app", "v1", r.server); err != nil {
		return err
	}
	if r.other, err = r.reg.Push("drover/app", "v2", r.server, "VARIANT=2"); err != nil {
		return err
	}
	if r.bb, err = r.reg.Push("drover/busybox", "v1", ""); err != nil {
		return err
	}
	r.engine, err = dockertest.StartEngine(ctx, r.reg.Host)
	return err
}

// env returns the shared rig, skipping (or failing under CI=true) when
// there is no engine.
func env(t *testing.T) *rig {
	t.Helper()
	dockertest.Require(t)
	if shared.err != nil {
		t.Fatalf("test engine: %v", shared.err)
	}
	return shared
}

// newRuntime builds an adapter on the rig's engine with host networking
// (the test engine has no bridge) and the given state root.
func (r *rig) newRuntime(t *testing.T, root string, gpus ...api.GPU) *Runtime {
	t.Helper()
	o := Options{Host: r.engine.Host, Root: root, Network: "host", AllowedDirs: []string{root},
		Ulimits: map[string]int64{"nofile": 1024, "nproc": 1024}}
	if gpus != nil {
		o.GPUs = func() []api.GPU { return gpus }
	}
	rt, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// freePort is a port nothing listens on now, outside the ephemeral range
// (the container binds it later; testutil.FreePort).
func freePort(t *testing.T) int { return testutil.FreePort(t) }

// serverSpec runs the testserver on a free port, ready on /health.
func (r *rig) serverSpec(t *testing.T, id string) runtime.Spec {
	port := freePort(t)
	return runtime.Spec{ID: id, Owner: "test", Image: runtime.Image{Kind: runtime.ImageOCI, Ref: r.app.Ref, Digest: r.app.Digest},
		Env:       map[string]string{"PORT": fmt.Sprint(port)},
		Ports:     []api.PortForward{{Name: "http", GuestPort: port}},
		Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 64},
		Readiness: runtime.Readiness{Readiness: api.Readiness{TCPPort: port, HTTPPath: "/health"}}}
}

// busyboxSpec runs a shell command in the busybox image.
func (r *rig) busyboxSpec(id, script string) runtime.Spec {
	return runtime.Spec{ID: id, Owner: "test", Image: runtime.Image{Kind: runtime.ImageOCI, Ref: r.bb.Ref},
		Command: []string{"/bin/sh", "-c", script}, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 64}}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func destroyAtEnd(t *testing.T, rt *Runtime, id string) {
	t.Cleanup(func() {
		if err := rt.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
	})
}

// waitEvent reads events until one of kind for id arrives.
func waitEvent(t *testing.T, ch <-chan runtime.Event, id string, kind runtime.EventKind, within time.Duration) runtime.Event {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("event channel closed waiting for %s %s", kind, id)
			}
			if ev.ID == id && ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event for %s in %s", kind, id, within)
		}
	}
}

// TestPullRunReadyStop: a pull reports progress, the started server
// becomes Ready by its HTTP path, probes pass, a graceful stop is clean
// and Destroy removes the container.
func TestPullRunReadyStop(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	rt := r.newRuntime(t, t.TempDir())
	events := rt.Subscribe(ctx)
	spec := r.serverSpec(t, "run1")
	destroyAtEnd(t, rt, spec.ID)
	st, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != runtime.StateCreated {
		t.Fatalf("after create: %s", st.State)
	}
	if p := waitEvent(t, events, spec.ID, runtime.EventProgress, 5*time.Second); !strings.Contains(p.Detail, "pull ") {
		t.Errorf("progress detail %q", p.Detail)
	}
	if _, err := rt.Create(ctx, spec); err != nil { // idempotent
		t.Fatalf("second create: %v", err)
	}
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, spec.ID, runtime.EventStarted, 10*time.Second)
	waitEvent(t, events, spec.ID, runtime.EventReady, 20*time.Second)
	st, err = rt.Inspect(ctx, spec.ID)
	if err != nil || !st.Ready || st.State != runtime.StateRunning || st.Ports["http"] != spec.Ports[0].GuestPort || st.PID == 0 {
		t.Fatalf("inspect: %+v, %v", st, err)
	}
	if err := rt.Probe(ctx, spec.ID); err != nil {
		t.Fatalf("probe: %v", err)
	}
	res, err := rt.Stop(ctx, spec.ID, 10*time.Second)
	if err != nil || res.HardStopped {
		t.Fatalf("stop: %+v, %v", res, err)
	}
	ev := waitEvent(t, events, spec.ID, runtime.EventExited, 10*time.Second)
	if ev.State != runtime.StateStopped {
		t.Errorf("exit event state %s, want stopped", ev.State)
	}
	if err := rt.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Inspect(ctx, spec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("inspect after destroy: %v", err)
	}
}

// TestDigestMismatch: a ref whose image is not the pinned digest is
// refused as image_pull_failed, and no container is made.
func TestDigestMismatch(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	rt := r.newRuntime(t, t.TempDir())
	spec := r.serverSpec(t, "mismatch")
	spec.Image.Digest = r.other.Digest // v1 pinned to v2's digest
	destroyAtEnd(t, rt, spec.ID)
	_, err := rt.Create(ctx, spec)
	if runtime.ReasonOf(err, "") != api.ReasonImagePullFailed || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("create: %v", err)
	}
	if _, err := rt.Inspect(ctx, spec.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("inspect: %v", err)
	}
	spec.Image.Ref = r.reg.Host + "/drover/absent:v1"
	spec.Image.Digest = ""
	if _, err := rt.Create(ctx, spec); runtime.ReasonOf(err, "") != api.ReasonImagePullFailed {
		t.Fatalf("absent image: %v", err)
	}
}

// TestHardStop: a workload ignoring SIGTERM is killed after the graceful
// timeout and reported HardStopped. The stop waits for Ready: the server
// ignores SIGTERM from before it listens, and a SIGTERM that lands
// earlier (Start returns once the process runs) still ends it at once.
func TestHardStop(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	rt := r.newRuntime(t, t.TempDir())
	spec := r.serverSpec(t, "stubborn")
	spec.Env["IGNORE_TERM"] = "1"
	destroyAtEnd(t, rt, spec.ID)
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	events := rt.Subscribe(ctx)
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, spec.ID, runtime.EventReady, 20*time.Second)
	res, err := rt.Stop(ctx, spec.ID, time.Second)
	if err != nil || !res.HardStopped {
		t.Fatalf("stop: %+v, %v", res, err)
	}
	if st, _ := rt.Inspect(ctx, spec.ID); st.State != runtime.StateStopped {
		t.Fatalf("state %s, want stopped", st.State)
	}
}

// TestCrashAndOOM: exit 1 is a crash (the reconciler's crash-loop back-off
// applies to it); allocating past the memory limit is oom_killed.
func TestCrashAndOOM(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	rt := r.newRuntime(t, t.TempDir())
	events := rt.Subscribe(ctx)
	crash := r.busyboxSpec("crash", "sleep 0.2; exit 1")
	oom := r.busyboxSpec("oom", "head -c 200m /dev/zero | tail")
	oom.Resources.MemoryMiB = 32
	for _, s := range []runtime.Spec{crash, oom} {
		destroyAtEnd(t, rt, s.ID)
		if _, err := rt.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Start(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		id     string
		reason api.ReasonCode
	}{{"crash", ""}, {"oom", api.ReasonOOMKilled}} {
		ev := waitEvent(t, events, c.id, runtime.EventExited, 30*time.Second)
		if ev.State != runtime.StateCrashed || ev.Reason != c.reason {
			t.Errorf("%s: exit event %+v, want crashed %q", c.id, ev, c.reason)
		}
		st, err := rt.Inspect(ctx, c.id)
		if err != nil || st.State != runtime.StateCrashed || st.ExitReason != c.reason {
			t.Errorf("%s: inspect %s %q (%s), %v", c.id, st.State, st.ExitReason, st.ExitDetail, err)
		}
	}
}

// TestRecoverAdopts: a fresh adapter (an agent restart) re-adopts the
// running container: same container, no duplicate, still Ready.
func TestRecoverAdopts(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	root := t.TempDir()
	rt := r.newRuntime(t, root)
	spec := r.serverSpec(t, "adopt")
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	before := containerID(ctx, t, rt, spec.ID)
	rt.Close()
	rt2 := r.newRuntime(t, root)
	destroyAtEnd(t, rt2, spec.ID)
	events := rt2.Subscribe(ctx)
	got, err := rt2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != spec.ID || !got[0].Adopted || got[0].State != runtime.StateRunning || got[0].Owner != "test" {
		t.Fatalf("recover: %+v", got)
	}
	waitEvent(t, events, spec.ID, runtime.EventReady, 20*time.Second)
	if after := containerID(ctx, t, rt2, spec.ID); after != before {
		t.Fatalf("container %s replaced by %s", before, after)
	}
	if _, err := rt2.Create(ctx, spec); err != nil { // same spec: the adopted one
		t.Fatal(err)
	}
	list, err := rt2.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %+v, %v", list, err)
	}
}

func containerID(ctx context.Context, t *testing.T, rt *Runtime, id string) string {
	t.Helper()
	res, err := rt.cli.ContainerInspect(ctx, containerName(id), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Container.ID
}

// TestSecretsNotInInspect: secrets reach the container as read-only files
// of mode 0400 from a tmpfs, and their values appear nowhere in the
// engine's inspect output; Destroy wipes them.
func TestSecretsNotInInspect(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	root := t.TempDir()
	rt := r.newRuntime(t, root)
	const value = "s3cr3t-v4lue-9731"
	spec := r.busyboxSpec("secrets", "test -r /run/drover/secrets/token && ! echo x > /run/drover/secrets/token && sleep 600")
	spec.Secrets = map[string][]byte{"token": []byte(value)}
	destroyAtEnd(t, rt, spec.ID)
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Start(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	st, err := rt.Inspect(ctx, spec.ID)
	if err != nil || st.State != runtime.StateRunning {
		t.Fatalf("the container could not read its secret read-only: %+v %v", st, err)
	}
	res, err := rt.cli.ContainerInspect(ctx, containerName(spec.ID), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(res.Container)
	if strings.Contains(string(res.Raw)+string(raw), value) {
		t.Fatal("the secret's value is in the engine's inspect output")
	}
	fi, err := os.Stat(rt.secretsDir(spec.ID) + "/token")
	if err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("secret file: %v, %v", fi, err)
	}
	if err := rt.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rt.secretsDir(spec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("secrets left after destroy: %v", err)
	}
}

// TestGPURequests: GPUs are asked of Docker as NVIDIA device requests
// (created only: there is no GPU here); an undiscovered GPU is refused
// with a field error.
func TestGPURequests(t *testing.T) {
	r := env(t)
	ctx := testCtx(t)
	zero := 0
	rt := r.newRuntime(t, t.TempDir(), api.GPU{Index: &zero, UUID: "GPU-8c1e0000-aaaa"})
	for _, c := range []struct {
		id    string
		gpus  []string
		ids   []string
		count int
	}{{"gpu-ids", []string{"0", "GPU-8c1e0000-aaaa"}, []string{"0", "GPU-8c1e0000-aaaa"}, 0}, {"gpu-all", []string{"all"}, nil, -1}} {
		spec := r.busyboxSpec(c.id, "true")
		spec.Devices.GPUs = c.gpus
		destroyAtEnd(t, rt, spec.ID)
		if _, err := rt.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		res, err := rt.cli.ContainerInspect(ctx, containerName(spec.ID), client.ContainerInspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dr := res.Container.HostConfig.DeviceRequests
		if len(dr) != 1 || dr[0].Driver != "nvidia" || dr[0].Count != c.count || fmt.Sprint(dr[0].DeviceIDs) != fmt.Sprint(c.ids) ||
			fmt.Sprint(dr[0].Capabilities) != "[[gpu]]" {
			t.Errorf("%s: device requests %+v", c.id, dr)
		}
	}
	spec := r.busyboxSpec("gpu-absent", "true")
	spec.Devices.GPUs = []string{"1"}
	if _, err := rt.Create(ctx, spec); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "spec.container.gpus[0]") {
		t.Fatalf("undiscovered GPU: %v", err)
	}
}
