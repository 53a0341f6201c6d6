package qemu

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/guestinit/microvmtest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/qemu/qemutest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestRealMicroVMSecretsInMemory boots a microVM (TCG) with a secret
// whose config drive is a sealed memfd: the workload sees the secret in
// its tmpfs, and no file under the agent's state, overlay or image
// directories (nor the test's rootfs directory) holds its bytes, after a
// stop and start too. A new agent (a second Runtime over the same root)
// has no seed: Start is secrets_injection_failed wrapping
// ErrSecretsNeeded, and Create with the same spec and secret gives the
// seed back, so the instance boots again. Other values are ErrExists for
// the agent that created the instance; state.json holds no digest of
// them.
func TestRealMicroVMSecretsInMemory(t *testing.T) {
	secret := []byte("drover-test-secret-3b9f0c2e")
	kit := microvmtest.Build(t, "")
	dir := t.TempDir()
	rootfs := microvmtest.Rootfs(t, dir)
	sum, err := qemutest.FileSHA256(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	root := shortDir(t)
	mk := func() *Runtime {
		return newTestRuntime(t, root, []string{dir}, func(o *Options) {
			o.QEMUBinary, o.QEMUImg = kit.QEMU, kit.QEMUImg
			o.MicroVM = &MicroVMOptions{Kernel: kit.Kernel, Initrd: kit.Initrd}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const id = "sec1"
	spec := runtime.Spec{ID: id, Owner: "test", Image: runtime.Image{URL: "file://" + rootfs, SHA256: sum},
		Command: []string{"/testserver"}, Env: map[string]string{"PORT": "8080", "LIST_DIR": guestinit.SecretsDir},
		Ports:     []api.PortForward{{Name: "http", GuestPort: 8080}},
		Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 256},
		Readiness: runtime.Readiness{Readiness: api.Readiness{TCPPort: 8080, HTTPPath: "/health", Timeout: api.Duration(2 * time.Minute)}},
		Secrets:   map[string][]byte{"api_token": secret},
		VM:        &runtime.VMSpec{MicroVM: true}}

	r := mk()
	if _, err := r.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(seedBytes(t, r, id)), base64.StdEncoding.EncodeToString(secret)) {
		t.Fatal("the in-memory config drive lacks the secret")
	}
	_, args, err := r.CommandLine(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if line := strings.Join(args, " "); !strings.Contains(line, "-add-fd fd=3,set=1") || !strings.Contains(line, "file=/dev/fdset/1,") {
		t.Errorf("command line does not take the config drive from an fd set: %s", line)
	}
	bootReady := func(r *Runtime, what string) {
		t.Helper()
		if _, err := r.Start(ctx, id); err != nil {
			t.Fatalf("%s: start: %v", what, err)
		}
		start := time.Now()
		st, _ := r.Inspect(ctx, id)
		for !st.Ready && st.State == runtime.StateRunning && time.Since(start) < 2*time.Minute {
			time.Sleep(50 * time.Millisecond)
			st, _ = r.Inspect(ctx, id)
		}
		if !st.Ready {
			t.Fatalf("%s: not ready after %v: %s %s\n%s", what, time.Since(start), st.State, st.ExitDetail, serialLog(t, st))
		}
		log := serialLog(t, st)
		if n := strings.Count(log, "list "+guestinit.SecretsDir+" 1 <nil>"); n == 0 {
			t.Errorf("%s: the workload did not see its secret in %s:\n%s", what, guestinit.SecretsDir, log)
		}
		noSecretOnDisk(t, secret, root, dir)
		if _, err := r.Stop(ctx, id, 30*time.Second); err != nil {
			t.Fatalf("%s: stop: %v", what, err)
		}
		noSecretOnDisk(t, secret, root, dir)
	}
	bootReady(r, "first boot")
	bootReady(r, "after a stop")
	other := spec
	other.Secrets = map[string][]byte{"api_token": []byte("another value")}
	if _, err := r.Create(ctx, other); !errors.Is(err, runtime.ErrExists) {
		t.Errorf("create with another secret value: %v, want ErrExists", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "instances", id, stateFile)); err != nil || bytes.Contains(b, []byte("digest")) {
		t.Errorf("state.json (%v) holds a digest of the secrets:\n%s", err, b)
	}

	// A new agent: the seed went with the old one.
	r2 := mk()
	if _, err := r2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	destroyAtEnd(t, r2, id)
	_, err = r2.Start(ctx, id)
	if !errors.Is(err, runtime.ErrSecretsNeeded) || runtime.ReasonOf(err, "") != api.ReasonSecretsInjectionFailed {
		t.Fatalf("start without the seed: %v, want secrets_injection_failed (ErrSecretsNeeded)", err)
	}
	renamed := spec
	renamed.Secrets = map[string][]byte{"other_name": secret}
	if _, err := r2.Create(ctx, renamed); !errors.Is(err, runtime.ErrExists) {
		t.Errorf("create with another secret name: %v, want ErrExists", err)
	}
	if _, err := r2.Create(ctx, spec); err != nil {
		t.Fatalf("create again with the secret: %v", err)
	}
	bootReady(r2, "after an agent restart")
}
