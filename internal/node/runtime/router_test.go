package runtime_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/node/runtime/runtimetest"
)

func vmSpec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Image: runtime.Image{URL: "file:///img", SHA256: "ab"}, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}}
}

func ociSpec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Image: runtime.Image{Kind: runtime.ImageOCI, Ref: "reg.example/app:v1"}, Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128}}
}

// TestRouterConformance: the router over two runtimes passes the port's
// conformance suite for VM specs and for container specs alike.
func TestRouterConformance(t *testing.T) {
	for name, spec := range map[string]func(string) runtime.Spec{"vm": vmSpec, "container": ociSpec} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			type pair struct{ vm, ct *mock.Runtime }
			byTest := map[*testing.T]pair{}
			newRT := func(t *testing.T) runtime.Runtime {
				p := pair{mock.New(mock.Options{}), mock.New(mock.Options{})}
				mu.Lock()
				byTest[t] = p
				mu.Unlock()
				return runtime.NewRouter(p.vm, p.ct)
			}
			reopen := func(t *testing.T) runtime.Runtime {
				mu.Lock()
				defer mu.Unlock()
				p := byTest[t]
				return runtime.NewRouter(p.vm.Reopen(), p.ct.Reopen())
			}
			runtimetest.Run(t, newRT, func(t *testing.T, id string) runtime.Spec { return spec(id) },
				runtimetest.Options{ReadyTimeout: 2 * time.Second, Graceful: time.Second, Reopen: reopen})
		})
	}
}

// TestRouterDispatch: containers go to the container runtime, VMs to the
// VM runtime; an id cannot be both; List and Subscribe merge.
func TestRouterDispatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vm, ct := mock.New(mock.Options{}), mock.New(mock.Options{})
	r := runtime.NewRouter(vm, ct)
	events := r.Subscribe(ctx)
	if _, err := r.Create(ctx, vmSpec("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, ociSpec("c")); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Inspect(ctx, "v"); err != nil {
		t.Errorf("vm runtime lacks v: %v", err)
	}
	if _, err := ct.Inspect(ctx, "c"); err != nil {
		t.Errorf("container runtime lacks c: %v", err)
	}
	if _, err := r.Create(ctx, ociSpec("v")); !errors.Is(err, runtime.ErrExists) {
		t.Errorf("v as a container: %v", err)
	}
	if _, err := r.Start(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	seen := false
	for !seen {
		select {
		case ev := <-events:
			seen = ev.ID == "c" && ev.Kind == runtime.EventStarted
		case <-ctx.Done():
			t.Fatal("no started event for c through the router")
		}
	}
	list, err := r.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if _, err := r.Inspect(ctx, "nope"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
	if err := r.Destroy(ctx, "nope"); err != nil {
		t.Errorf("destroy unknown: %v", err)
	}
	if got := r.Names(); len(got) != 2 || got[0] != "mock" {
		t.Errorf("names %v", got)
	}
}

// noLogs hides a runtime's LogReader (a runtime that cannot read logs).
type noLogs struct{ runtime.Runtime }

// TestRouterLogs: Logs reads from the runtime that holds the id; a runtime
// without a LogReader is ErrLogsUnsupported, an unknown id ErrNotFound.
func TestRouterLogs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vm, ct := mock.New(mock.Options{}), mock.New(mock.Options{})
	r := runtime.NewRouter(noLogs{vm}, ct)
	if _, err := r.Create(ctx, vmSpec("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, ociSpec("c")); err != nil {
		t.Fatal(err)
	}
	rc, err := r.Logs(ctx, "c", runtime.LogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !strings.HasPrefix(string(b), "stdout mock: instance c started\n") {
		t.Errorf("logs of c: %q, %v", b, err)
	}
	// A fresh router finds c without having created it.
	rc, err = runtime.NewRouter(noLogs{vm}, ct).Logs(ctx, "c", runtime.LogOptions{Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(rc)
	rc.Close()
	if string(b) != "stderr mock: no workload runs in the mock runtime\n" {
		t.Errorf("tail 1 of c: %q", b)
	}
	if _, err := r.Logs(ctx, "v", runtime.LogOptions{}); !errors.Is(err, runtime.ErrLogsUnsupported) || errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("logs of v on a runtime without logs: %v", err)
	}
	if _, err := r.Logs(ctx, "nope", runtime.LogOptions{}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("logs of an unknown id: %v", err)
	}
}

// multiNames is a VM runtime with several names (qemu with its microVM
// mode).
type multiNames struct{ runtime.Runtime }

func (multiNames) Names() []string { return []string{"qemu", "microvm"} }

// TestRouterMicroVM: a spec with VM.MicroVM goes to the VM runtime even
// with an OCI image; Names lists the VM runtime's own names.
func TestRouterMicroVM(t *testing.T) {
	vm, ct := mock.New(mock.Options{}), mock.New(mock.Options{})
	r := runtime.NewRouter(multiNames{vm}, ct)
	s := ociSpec("m")
	s.VM = &runtime.VMSpec{MicroVM: true}
	if got := r.For(s); got.Name() != vm.Name() || got == runtime.Runtime(ct) {
		t.Errorf("microVM spec routed to %v", got)
	}
	if got := r.For(ociSpec("c")); got != runtime.Runtime(ct) {
		t.Errorf("OCI spec routed to %v", got)
	}
	if got := r.Names(); strings.Join(got, ",") != "qemu,microvm,mock" {
		t.Errorf("names %v", got)
	}
}
