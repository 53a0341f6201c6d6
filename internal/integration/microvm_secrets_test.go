package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/node/accel"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestMicroVMSecretsEndToEnd: a secret set through the API reaches a
// microVM (TCG) on a real agent: the workload sees it on its tmpfs; the
// config drive is a memfd, so no file under the agent's state or runtime
// directories holds the value. A crash restarts it with the same memfd;
// after an agent restart the new agent adopts the running VM, and when it
// crashes again the reconciler fetches the secret from the control plane
// again (the memfd went with the old agent) and boots it. Neither
// process's log nor the instance API ever holds the value.
func TestMicroVMSecretsEndToEnd(t *testing.T) {
	kit := microvmtest.Build(t, "")
	reg := ocitest.StartRegistry()
	defer reg.Close()
	srvBin, err := ocitest.BuildTestServer(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := reg.Push("drover/web", "v1", srvBin, "PORT=8080")
	if err != nil {
		t.Fatal(err)
	}
	rtDir, err := os.MkdirTemp("", "dms") // unix socket paths stay short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(rtDir) })
	stateDir := t.TempDir()

	var cpLogs, agentLogs logBuf
	e := startEnv(t, openSQLite(t), func(c *server.Config) { c.Logger = cpLogs.logger() })
	value := "microvm-s3cr3t-" + time.Now().Format("150405.000000000")
	jv, _ := json.Marshal(value)
	if code, raw := e.rawOp(http.MethodPut, "/api/v1/secrets/api-token", `{"value":`+string(jv)+`}`); code != http.StatusCreated {
		t.Fatalf("set: %d %s", code, raw)
	}
	bt := e.createHost("mvs-1")
	startAgent := func() (stop func()) {
		cfg := agent.Config{ControlPlaneURL: e.nodeURL, HostID: "mvs-1", BootstrapToken: bt.Token, CAHash: e.srv.CAHash(),
			OSFamily: "linux", StateDir: stateDir, ListenAddr: "127.0.0.1:0", HeartbeatInterval: 100 * time.Millisecond,
			Runtime: qemu.Name, RuntimeDir: rtDir, ReconcileInterval: 200 * time.Millisecond,
			Runtimes: runtime.Registry{qemu.Name: qemu.Entry(), mock.Name: mock.Entry()}, ImageAllowLocalURLs: true,
			RuntimeSettings: map[string]string{"NODE_AGENT_QEMU_MICROVM_KERNEL": kit.Kernel,
				"NODE_AGENT_QEMU_MICROVM_INITRD": kit.Initrd, "NODE_AGENT_QEMU_CGROUP_PARENT": "none"}}
		a, err := agent.New(cfg, agent.WithLogger(agentLogs.logger()), agent.WithAccelProbe(fixedAccel(accel.TCG)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		stopped := false
		stop = func() {
			if !stopped {
				stopped = true
				cancel()
				<-done
			}
		}
		t.Cleanup(stop)
		return stop
	}
	stopAgent := startAgent()
	e.waitHostStatus("mvs-1", api.HostHealthy, 60*time.Second)
	waitCapacity(t, e, "mvs-1")

	spec := api.InstanceSpec{Runtime: api.RuntimeMicroVM, VCPUs: 1, MemoryMiB: 256, Secrets: []string{"api-token"},
		Container:       &api.ContainerSpec{Image: img.Ref, Digest: img.Digest, Env: map[string]string{"LIST_DIR": guestinit.SecretsDir}},
		Network:         api.NetworkSpec{Forwards: []api.PortForward{{Name: "http", GuestPort: 8080}}},
		Readiness:       api.Readiness{TCPPort: 8080, HTTPPath: "/health", Timeout: api.Duration(2 * time.Minute)},
		GracefulTimeout: api.Duration(30 * time.Second)}
	in := e.createInstance(api.CreateInstanceRequest{Name: "sec-web", HostID: "mvs-1", Spec: spec})
	ready := e.waitPhase(in.ID, api.InstanceReady, "", 3*time.Minute)
	serial := filepath.Join(rtDir, "instances", in.ID, "serial.log")
	sawSecret := func(what string, runs int) {
		t.Helper()
		b, err := os.ReadFile(serial)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "list "+guestinit.SecretsDir+" 1 <nil>"); n < runs {
			t.Errorf("%s: the workload saw its secret in %d runs, want %d:\n%s", what, n, runs, b)
		}
	}
	noValue := func(what string) {
		t.Helper()
		for _, dir := range []string{stateDir, rtDir} {
			err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				b, err := os.ReadFile(p)
				if err != nil {
					return nil
				}
				for _, f := range secretForms(value) {
					if bytes.Contains(b, []byte(f)) {
						t.Errorf("%s: %s holds the secret value", what, p)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{"/api/v1/instances", "/api/v1/instances/" + in.ID, "/api/v1/instances/" + in.ID + "/events"} {
			_, raw := e.rawOp(http.MethodGet, p, "")
			assertNoValue(t, what+": GET "+p, string(raw), value)
		}
	}
	sawSecret("first boot", 1)
	noValue("first boot")

	// A crash: the reconciler starts it again with the seed in memory.
	crashAndWait := func(what string, pid int) api.Instance {
		t.Helper()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("%s: kill qemu %d: %v", what, pid, err)
		}
		return e.waitInstance(in.ID, 3*time.Minute, what+": Ready again with another qemu", func(got api.Instance, st int) bool {
			return st == http.StatusOK && got.Phase == api.InstanceReady && got.Runtime != nil && got.Runtime.PID != 0 && got.Runtime.PID != pid
		})
	}
	again := crashAndWait("crash", ready.Runtime.PID)
	sawSecret("after a crash", 2)
	noValue("after a crash")

	// A new agent adopts the running VM; after the next crash the seed
	// is rebuilt from the secret fetched again.
	stopAgent()
	startAgent()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(agentLogs.String(), "instance adopted"); {
		if time.Now().After(deadline) {
			t.Fatal("the new agent did not adopt the running VM within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	crashAndWait("crash after an agent restart", again.Runtime.PID)
	if !strings.Contains(agentLogs.String(), "reading them again") {
		t.Error("the agent's log does not show the secrets being read again")
	}
	sawSecret("after an agent restart", 3)
	noValue("after an agent restart")

	if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusAccepted {
		t.Fatalf("delete: HTTP %d", st)
	}
	e.waitGone(in.ID, 2*time.Minute)
	for where, text := range map[string]string{"the agent's log": agentLogs.String(), "the control plane's log": cpLogs.String()} {
		assertNoValue(t, where, text, value)
	}
}
