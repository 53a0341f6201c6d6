package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/image"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// vmTestEnv is a provisioner over the mock runtime and a bare host, with
// a base image in an allowed directory and an SSH-banner listener.
type vmTestEnv struct {
	rt      *mock.Runtime
	h       Handlers
	params  map[string]any
	sshPort int
}

func newVMTestEnv(t *testing.T, missing ...string) *vmTestEnv {
	t.Helper()
	base := t.TempDir()
	images := filepath.Join(base, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(images, "base.img")
	content := []byte("not really a disk, but the mock runtime does not boot it")
	if err := os.WriteFile(img, content, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cache, err := image.NewCache(image.Options{Dir: filepath.Join(base, "cache"), AllowedDirs: []string{images}, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rt := mock.New(mock.Options{Log: quiet})
	p, err := slicevm.New(slicevm.Options{Runtime: rt, Images: cache, SysfsRoot: filepath.Join(base, "host"),
		StateDir: filepath.Join(base, "state"), CloudInitDir: filepath.Join(base, "slices"), Log: quiet,
		LookPath: func(name string) (string, error) {
			for _, m := range missing {
				if m == name {
					return "", fmt.Errorf("%s not found", name)
				}
			}
			return "/usr/bin/" + name, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			_ = c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	return &vmTestEnv{rt: rt, h: VMHandlers(p), sshPort: port, params: map[string]any{
		"allocation_id": "alloc-1", "vm_name": "vm-1", "image_path": img, "image_sha256": hex.EncodeToString(sum[:]),
		"vcpus": 2, "memory_mib": 1024, "readiness_timeout_seconds": 5,
		"network": api.NetworkSpec{Forwards: []api.PortForward{{Name: "ssh", GuestPort: 22, HostPort: port}}},
	}}
}

func (e *vmTestEnv) run(t *testing.T, ctx context.Context, typ string, params any) (Outcome, []string, error) {
	t.Helper()
	h, ok := e.h[typ]
	if !ok || h.Timeout != 20*time.Minute {
		t.Fatalf("handler %s = %+v, %v", typ, h, ok)
	}
	raw, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var phases []string
	out, err := h.Run(ctx, Task{Type: typ, Params: raw, Progress: func(phase string, _ time.Duration, _ error) {
		mu.Lock()
		defer mu.Unlock()
		phases = append(phases, phase)
	}})
	return out, phases, err
}

func TestVMHandlers(t *testing.T) {
	ctx := context.Background()
	e := newVMTestEnv(t)

	_, _, err := e.run(t, ctx, task.TypeVMProvision, map[string]any{"vm_name": "Bad Name"})
	var he *HandlerError
	if !errors.As(err, &he) || he.Code != "invalid_params" || !strings.Contains(he.Message, "params.vm_name") {
		t.Fatalf("invalid params: %v", err)
	}

	out, phases, err := e.run(t, ctx, task.TypeVMProvision, e.params)
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	po, ok := out.Output.(slicevm.ProvisionOutput)
	if !ok || po.SSHPort != e.sshPort || po.SSHHost != "127.0.0.1" || !po.Readiness.Ready || po.ConsoleModel != "gateway_required" {
		t.Fatalf("output = %#v", out.Output)
	}
	if len(phases) != len(slicevm.ProvisionPhases()) || out.Timings["readiness_ms"] < 0 || len(out.Timings) != len(phases) {
		t.Errorf("phases %v, timings %v", phases, out.Timings)
	}

	for i := 0; i < 2; i++ {
		out, _, err = e.run(t, ctx, task.TypeVMRelease, map[string]any{"vm_name": "vm-1"})
		ro, ok := out.Output.(slicevm.ReleaseOutput)
		if err != nil || !ok || ro.AlreadyReleased != (i == 1) {
			t.Fatalf("release #%d = %#v, %v", i, out.Output, err)
		}
	}
	if _, _, err := e.run(t, ctx, task.TypeVMRelease, map[string]any{"vm_name": "vm-1", "wipe": "yes"}); !errors.As(err, &he) || he.Code != "invalid_params" {
		t.Errorf("invalid release params: %v", err)
	}
}

// TestVMHandlersFailure: a failed phase is a HandlerError with the
// slicevm code, naming the phase (and blocker), and the outcome still
// carries the output with the cleanup steps.
func TestVMHandlersFailure(t *testing.T) {
	ctx := context.Background()
	e := newVMTestEnv(t)
	e.rt.SetBehavior("vm-1", mock.Behavior{StartErr: api.ReasonVMStartFailed})
	out, phases, err := e.run(t, ctx, task.TypeVMProvision, e.params)
	var he *HandlerError
	if !errors.As(err, &he) || he.Code != slicevm.CodeVMStartFailed || !strings.HasPrefix(he.Message, "phase virt_install: ") {
		t.Fatalf("err = %v", err)
	}
	po, ok := out.Output.(slicevm.ProvisionOutput)
	if !ok || po.FailedPhase != slicevm.PhaseVirtInstall || len(po.Cleanup) != 5 || out.Timings["cleanup_leases_ms"] < 0 {
		t.Fatalf("output = %#v, timings %v", out.Output, out.Timings)
	}
	if phases[len(phases)-1] != slicevm.CleanupCloudInitDir {
		t.Errorf("progress = %v", phases)
	}

	e = newVMTestEnv(t, "qemu-img")
	_, _, err = e.run(t, ctx, task.TypeVMProvision, e.params)
	if !errors.As(err, &he) || he.Code != slicevm.CodeMissingDependency || !strings.Contains(he.Message, "(blocker: command_missing:qemu-img)") {
		t.Fatalf("err = %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err = e.run(t, cctx, task.TypeVMProvision, e.params); err == nil || errors.As(err, &he) {
		t.Errorf("canceled provision = %v, want the raw error for the task loop", err)
	}
}
