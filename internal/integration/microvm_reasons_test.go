package integration

import (
	"archive/tar"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestMicroVMReasonCodesTCG produces seed 001's failure reason codes
// through the real path (control plane → agent → reconciler → QEMU
// microVM runtime under TCG, images from an in-test registry), one case
// each: image_pull_failed (a tag the registry lacks), rootfs_build_failed
// (a layer writing outside the root), secrets_missing (a secret nobody
// holds), healthcheck_failed (the guest's /health turns 503 after Ready),
// crash_loop_backoff (a workload that keeps exiting) and node_draining
// (the host is drained, then undrained). TestMicroVMInstanceTCG covers
// terminated_by_operator and oom_killed; docs/runbooks/microvms.md lists
// which test produces each of the twelve.
func TestMicroVMReasonCodesTCG(t *testing.T) {
	h := startMicroVMHost(t, "mv-r", func(c *agent.Config) {
		c.RestartBackoff, c.RestartBackoffMax, c.CrashLoopThreshold = 300*time.Millisecond, time.Second, 2
	})
	e, img := h.e, h.img
	base := api.InstanceSpec{Runtime: api.RuntimeMicroVM, VCPUs: 1, MemoryMiB: 256,
		Container: &api.ContainerSpec{Image: img.Ref, Digest: img.Digest},
		Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 8080}}},
		Readiness: api.Readiness{TCPPort: 8080, HTTPPath: "/health", Timeout: api.Duration(3 * time.Minute)},
		// A stop ends in seconds: the test server exits on SIGTERM.
		GracefulTimeout: api.Duration(30 * time.Second)}
	with := func(f func(*api.InstanceSpec)) api.InstanceSpec {
		s := base
		c := *base.Container
		s.Container = &c
		f(&s)
		return s
	}
	evil := pushTraversalImage(t, h.reg)

	// Failures before boot, at once: no guest runs for them.
	early := []struct {
		name   string
		spec   api.InstanceSpec
		reason api.ReasonCode
		msg    []string // the message names the cause
	}{
		{"absent-tag", with(func(s *api.InstanceSpec) {
			s.Container.Image, s.Container.Digest = strings.TrimSuffix(img.Ref, ":v1")+":absent", ""
		}), api.ReasonImagePullFailed, []string{"absent"}},
		{"evil-layer", with(func(s *api.InstanceSpec) { s.Container.Image, s.Container.Digest = evil.Ref, evil.Digest }),
			api.ReasonRootfsBuildFailed, []string{"../../escape", "layer sha256:"}},
		{"no-secret", with(func(s *api.InstanceSpec) { s.Secrets = []string{"db-password"} }),
			api.ReasonSecretsMissing, []string{"db-password"}},
	}
	ids := map[string]string{}
	for _, c := range early {
		ids[c.name] = e.createInstance(api.CreateInstanceRequest{Name: c.name, HostID: "mv-r", Spec: c.spec}).ID
	}
	for _, c := range early {
		got := e.waitPhase(ids[c.name], api.InstanceFailed, c.reason, 2*time.Minute)
		for _, m := range c.msg {
			if !strings.Contains(got.Message, m) {
				t.Errorf("%s: %s message %q does not name %q", c.name, c.reason, got.Message, m)
			}
		}
		t.Logf("%s: %s %q", c.name, got.ReasonCode, got.Message)
		e.deleteInstance(ids[c.name])
	}

	// healthcheck_failed: Ready, then /health answers 503 (the test
	// server's HEALTH_OK_REQUESTS), so the health checks fail.
	sick := e.createInstance(api.CreateInstanceRequest{Name: "sick", HostID: "mv-r", Spec: with(func(s *api.InstanceSpec) {
		s.Container.Env = map[string]string{"HEALTH_OK_REQUESTS": "2"}
		s.HealthCheck = &api.HealthCheck{Interval: api.Duration(time.Second), FailureThreshold: 2}
	})})
	ev := e.waitEvent(sick.ID, api.InstanceFailed, api.ReasonHealthcheckFailed, 3*time.Minute)
	t.Logf("sick: %s %q", ev.ReasonCode, ev.Message)
	e.requireEventBefore(sick.ID, api.InstanceReady, ev.Seq)
	e.deleteInstance(sick.ID)

	// crash_loop_backoff: a workload that exits 1 at once restarts with
	// backoff; past the threshold (2 here) the reason says so.
	crashy := e.createInstance(api.CreateInstanceRequest{Name: "crashy", HostID: "mv-r", Spec: with(func(s *api.InstanceSpec) {
		s.Container.Command = []string{"/bin/sh", "-c", "exit 1"}
		s.Readiness = api.Readiness{}
	})})
	ev = e.waitEvent(crashy.ID, api.InstanceFailed, api.ReasonCrashLoopBackoff, 4*time.Minute)
	t.Logf("crashy: %s %q", ev.ReasonCode, ev.Message)
	e.deleteInstance(crashy.ID)

	// node_draining: a Ready instance stops when its host drains and
	// starts again when it is undrained.
	web := e.createInstance(api.CreateInstanceRequest{Name: "web", HostID: "mv-r", Spec: base})
	e.waitPhase(web.ID, api.InstanceReady, "", 3*time.Minute)
	if st := e.op(http.MethodPost, "/api/v1/hosts/mv-r/drain", nil, nil); st != http.StatusOK {
		t.Fatalf("drain: HTTP %d", st)
	}
	e.waitEvent(web.ID, api.InstanceDraining, api.ReasonNodeDraining, time.Minute)
	stopped := e.waitPhase(web.ID, api.InstanceStopped, api.ReasonNodeDraining, 2*time.Minute)
	t.Logf("web: %s %s %q", stopped.Phase, stopped.ReasonCode, stopped.Message)
	if st := e.op(http.MethodPost, "/api/v1/hosts/mv-r/undrain", nil, nil); st != http.StatusOK {
		t.Fatalf("undrain: HTTP %d", st)
	}
	e.waitPhase(web.ID, api.InstanceReady, "", 3*time.Minute)
	e.deleteInstance(web.ID)
	for _, id := range []string{sick.ID, crashy.ID, web.ID} {
		e.waitGone(id, 2*time.Minute)
	}
	if procs := qemuProcesses(t, h.rtDir); len(procs) != 0 {
		t.Errorf("qemu processes left after delete: %v", procs)
	}
}

// pushTraversalImage pushes an image whose layer writes ../../escape.
func pushTraversalImage(t *testing.T, reg *ocitest.Registry) ocitest.Image {
	t.Helper()
	layer, err := ocitest.Layer(ocitest.File{Hdr: tar.Header{Name: "../../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1},
		Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	img, err := ocitest.NewImage(v1.Config{Cmd: []string{"/bin/sh"}}, layer)
	if err != nil {
		t.Fatal(err)
	}
	pushed, err := reg.PushImage("drover/evil", "v1", img)
	if err != nil {
		t.Fatal(err)
	}
	return pushed
}

// deleteInstance deletes an instance through the API.
func (e *env) deleteInstance(id string) {
	e.t.Helper()
	if st := e.op(http.MethodDelete, "/api/v1/instances/"+id, nil, nil); st != http.StatusAccepted {
		e.t.Fatalf("delete %s: HTTP %d", id, st)
	}
}

// waitEvent waits for a transition with phase and reason in the
// instance's history (GET /api/v1/instances/{id}/events): a phase the
// current status may already have left.
func (e *env) waitEvent(id string, phase api.InstancePhase, reason api.ReasonCode, within time.Duration) api.InstanceEvent {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		var evs []api.InstanceEvent
		e.op(http.MethodGet, "/api/v1/instances/"+id+"/events", nil, &evs)
		for _, ev := range evs {
			if ev.Phase == phase && ev.ReasonCode == reason {
				return ev
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("instance %s: no %s/%s transition after %s; events: %s", id, phase, reason, within, eventsText(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireEventBefore fails unless the history has phase before seq.
func (e *env) requireEventBefore(id string, phase api.InstancePhase, seq int64) {
	e.t.Helper()
	var evs []api.InstanceEvent
	e.op(http.MethodGet, "/api/v1/instances/"+id+"/events", nil, &evs)
	for _, ev := range evs {
		if ev.Phase == phase && ev.Seq < seq {
			return
		}
	}
	e.t.Errorf("instance %s: no %s before event %d; events: %s", id, phase, seq, eventsText(evs))
}

func eventsText(evs []api.InstanceEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "[%d %s %s %q] ", ev.Seq, ev.Phase, ev.ReasonCode, ev.Message)
	}
	return b.String()
}
