package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/logsgw"
	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker"
	"github.com/drover-dev/drover/internal/node/runtime/docker/dockertest"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestContainerInstanceThroughControlPlane: a real agent runs VMs (the
// mock) and containers (docker, against a private dockerd) side by side
// (NODE_AGENT_CONTAINER_RUNTIME). Its capabilities say so; an instance with
// runtime docker created through POST /api/v1/instances, from an image in
// an in-test registry, is placed on it, pulled, started and Ready by its
// HTTP path; its stdout and stderr come through GET
// /api/v1/instances/{id}/logs (the Router's logs from the docker runtime);
// its transitions are in the events API; stop → Stopped; delete → gone,
// container and all.
func TestContainerInstanceThroughControlPlane(t *testing.T) {
	dockertest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reg := dockertest.StartRegistry()
	defer reg.Close()
	dir := t.TempDir()
	server, err := dockertest.BuildTestServer(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := reg.Push("drover/app", "v1", server)
	if err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, openSQLite(t))
	eng := startContainerHost(ctx, t, e, "box-1", reg.Host)

	var h api.Host
	e.op(http.MethodGet, "/api/v1/hosts/box-1", nil, &h)
	if c := h.Capabilities; c == nil || !slices.Equal(c.Runtimes, []string{"mock", "docker"}) || c.ContainerEngine != "docker" || c.ContainerEngineVersion == "" {
		t.Fatalf("capabilities: %+v", c)
	}

	port := freeLoopbackPort(t)
	spec := api.InstanceSpec{Runtime: api.RuntimeDocker, VCPUs: 1, MemoryMiB: 64,
		Container: &api.ContainerSpec{Image: img.Ref, Digest: img.Digest, Env: map[string]string{"PORT": fmt.Sprint(port)},
			Command: []string{"/bin/sh", "-c", "echo starting >&2; sleep 0.3; exec /testserver"}},
		Network:   api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: port}}},
		Readiness: api.Readiness{TCPPort: port, HTTPPath: "/api/tags"}, GracefulTimeout: api.Duration(5 * time.Second)}
	in := e.createInstance(api.CreateInstanceRequest{Name: "llm", Spec: spec}) // placed: the only docker host
	if in.HostID != "box-1" {
		t.Fatalf("placed on %q", in.HostID)
	}
	ready := e.waitPhase(in.ID, api.InstanceReady, "", 60*time.Second)
	if r := ready.Runtime; r == nil || r.Runtime != "docker" || r.Ports["http"] != port || r.PID == 0 {
		t.Fatalf("ready runtime info: %+v", r)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the container's server: %v %v", resp, err)
	}
	resp.Body.Close()

	// Its log through the control plane: both streams, named in SSE.
	listening := fmt.Sprintf("listening on %d", port)
	lresp := e.logsRequest(ctx, in.ID, "")
	body, _ := io.ReadAll(lresp.Body)
	lresp.Body.Close()
	if lresp.StatusCode != http.StatusOK || string(body) != "starting\n"+listening+"\n" {
		t.Fatalf("logs = HTTP %d %q", lresp.StatusCode, body)
	}
	if got := lresp.Trailer.Get(logsgw.TrailerEnd); got != "eof" {
		t.Errorf("logs end trailer = %q, want eof", got)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.opURL+"/api/v1/instances/"+in.ID+"/logs?tail=2", nil)
	req.Header.Set("Authorization", "Bearer "+e.opToken)
	req.Header.Set("Accept", "text/event-stream")
	lresp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(lresp.Body)
	lresp.Body.Close()
	if want := "event: stderr\ndata: starting\n\nevent: stdout\ndata: " + listening + "\n\n"; !strings.HasPrefix(string(body), want) {
		t.Errorf("logs as SSE = %q, want it to start %q", body, want)
	}
	lresp = e.logsRequest(ctx, in.ID, "tail=1")
	body, _ = io.ReadAll(lresp.Body)
	lresp.Body.Close()
	if string(body) != listening+"\n" {
		t.Errorf("logs tail=1 = %q", body)
	}

	// A pinned VM-only host is a field error naming spec.runtime.
	e.createHost("vm-only")
	var ce api.CodedError
	if st := e.op(http.MethodPost, "/api/v1/instances", api.CreateInstanceRequest{Name: "pinned", HostID: "vm-only", Spec: spec}, &ce); st != http.StatusBadRequest && st != http.StatusUnprocessableEntity {
		t.Errorf("pinned to a VM-only host: HTTP %d %+v", st, ce)
	}

	e.op(http.MethodPost, "/api/v1/instances/"+in.ID+"/stop", nil, nil)
	e.waitPhase(in.ID, api.InstanceStopped, api.ReasonTerminatedByOperator, 30*time.Second)

	var evs []api.InstanceEvent
	if st := e.op(http.MethodGet, "/api/v1/instances/"+in.ID+"/events", nil, &evs); st != http.StatusOK {
		t.Fatalf("events: HTTP %d", st)
	}
	var phases []string
	for _, ev := range evs {
		if len(phases) == 0 || phases[len(phases)-1] != string(ev.Phase) {
			phases = append(phases, string(ev.Phase))
		}
	}
	for _, want := range []string{"Pending", "Booting", "Ready", "Draining", "Stopped"} {
		if !slices.Contains(phases, want) {
			t.Errorf("events %v lack %s", phases, want)
		}
	}

	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusOK && st != http.StatusAccepted && st != http.StatusNoContent {
		t.Fatalf("delete: HTTP %d", st)
	}
	e.waitGone(in.ID, 30*time.Second)
	rt, err := docker.New(ctx, docker.Options{Host: eng.Host, Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if list, err := rt.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("containers left after delete: %+v, %v", list, err)
	}
}

// freeLoopbackPort is a 127.0.0.1 port nothing listens on now.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startContainerHost starts a private dockerd that trusts the registry at
// regHost, and a real agent for host id running VMs on the mock runtime
// and containers on that engine; it returns once the host is healthy with
// its capacity reported, and the engine. Both stop when the test ends.
func startContainerHost(ctx context.Context, t *testing.T, e *env, id, regHost string) *dockertest.Engine {
	t.Helper()
	eng, err := dockertest.StartEngine(ctx, regHost)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dockerd:\n%s", eng.Log())
		}
	})
	bt := e.createHost(id)
	cfg := agent.Config{ControlPlaneURL: e.nodeURL, HostID: id, BootstrapToken: bt.Token, CAHash: e.srv.CAHash(),
		OSFamily: "linux", StateDir: t.TempDir(), ListenAddr: "127.0.0.1:0", HeartbeatInterval: 100 * time.Millisecond,
		ReconcileInterval: 200 * time.Millisecond, Runtime: mock.Name, ContainerRuntime: docker.Name,
		Runtimes: runtime.Registry{mock.Name: mock.Entry(), docker.Name: docker.Entry()},
		RuntimeSettings: map[string]string{"NODE_AGENT_DOCKER_HOST": eng.Host, "NODE_AGENT_DOCKER_NETWORK": "host",
			"NODE_AGENT_DOCKER_ULIMIT_NOFILE": "1024", "NODE_AGENT_DOCKER_ULIMIT_NPROC": "1024"}}
	a, err := agent.New(cfg, agent.WithLogger(testLogger(t).With("agent", id)), agent.WithAccelProbe(fixedAccel(accel.TCG)))
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgent := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() { stopAgent(); <-done })
	e.waitHostStatus(id, api.HostHealthy, 10*time.Second)
	waitCapacity(t, e, id)
	return eng
}
