package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"os/user"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/osuser"
	"github.com/drover-dev/drover/internal/wire/task"
)

func runAlloc(t *testing.T, h Handlers, typ string, params any) (Outcome, *HandlerError) {
	t.Helper()
	b, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	out, err := h[typ].Run(context.Background(), Task{ID: "t1", Type: typ, Params: b})
	if err == nil {
		return out, nil
	}
	var he *HandlerError
	if !errors.As(err, &he) {
		t.Fatalf("%s: error %v is not a *HandlerError", typ, err)
	}
	return out, he
}

func TestAllocHandlersRegistered(t *testing.T) {
	h := DefaultHandlers(Config{StateDir: t.TempDir()})
	for typ, timeout := range map[string]time.Duration{task.TypeAllocProvisionUser: 2 * time.Minute, task.TypeAllocDeprovisionUser: 2 * time.Minute} {
		if got, ok := h[typ]; !ok || got.Timeout != timeout || got.Run == nil {
			t.Errorf("DefaultHandlers[%s] = %+v, %v", typ, got, ok)
		}
	}
}

type allocCase struct {
	name, typ string
	params    any
	code      string
}

func TestAllocHandlersErrors(t *testing.T) {
	h := AllocHandlers(Config{StateDir: t.TempDir()})
	tests := []allocCase{
		{"provision: missing username", task.TypeAllocProvisionUser, map[string]any{"allocation_id": "a1"}, "invalid_params"},
		{"provision: root", task.TypeAllocProvisionUser, map[string]any{"allocation_id": "a1", "username": "root"}, "invalid_params"},
		{"provision: bad key", task.TypeAllocProvisionUser, map[string]any{"allocation_id": "a1", "username": "alice",
			"ssh_authorized_keys": []string{"ssh-ed25519 nope"}}, "invalid_params"},
		{"provision: unknown field", task.TypeAllocProvisionUser, map[string]any{"allocation_id": "a1", "username": "alice", "uid": 0}, "invalid_params"},
		{"deprovision: bad username", task.TypeAllocDeprovisionUser, map[string]any{"allocation_id": "a1", "username": "A B"}, "invalid_params"},
	}
	if goruntime.GOOS == "linux" {
		system := "daemon"
		if _, err := user.Lookup(system); err != nil {
			system = "nobody"
		}
		tests = append(tests,
			allocCase{"provision: unmanaged system user", task.TypeAllocProvisionUser, map[string]any{"allocation_id": "a1", "username": system}, osuser.CodeUserExistsUnmanaged},
			allocCase{"deprovision: unmanaged system user", task.TypeAllocDeprovisionUser, map[string]any{"allocation_id": "a1", "username": system}, osuser.CodeUserExistsUnmanaged},
		)
	} else {
		tests = append(tests, allocCase{"unsupported OS", task.TypeAllocProvisionUser, map[string]any{"allocation_id": "a1", "username": "alice"}, "not_supported"})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, he := runAlloc(t, h, tc.typ, tc.params)
			if he == nil || he.Code != tc.code {
				t.Errorf("error = %v, want code %s", he, tc.code)
			}
		})
	}
}

func TestAllocHandlersNotSupported(t *testing.T) {
	h := allocHandlers(nil, fmt.Errorf("%w on plan9", osuser.ErrUnsupported))
	for _, typ := range []string{task.TypeAllocProvisionUser, task.TypeAllocDeprovisionUser} {
		_, he := runAlloc(t, h, typ, map[string]any{"allocation_id": "a1", "username": "alice"})
		if he == nil || he.Code != "not_supported" || !strings.Contains(he.Message, "not supported on plan9") {
			t.Errorf("%s: error = %v", typ, he)
		}
	}
}

// TestAllocHandlersReal provisions and removes a real throw-away user
// through the handlers (root only; CI=true makes a skip a failure).
func TestAllocHandlersReal(t *testing.T) {
	if goruntime.GOOS != "linux" || os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" && goruntime.GOOS == "linux" {
			t.Fatal("CI=true: this test must run as root")
		}
		t.Skip("needs root on Linux: skipping the real allocation user test")
	}
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("drovert%06d", n.Int64())
	if _, err := user.Lookup(name); err == nil {
		t.Skipf("%s exists already", name)
	}
	t.Cleanup(func() {
		if _, err := user.Lookup(name); err == nil {
			_ = exec.Command("userdel", "--remove", name).Run()
		}
	})
	h := AllocHandlers(Config{StateDir: t.TempDir()})
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl t@h"
	out, he := runAlloc(t, h, task.TypeAllocProvisionUser, map[string]any{"allocation_id": "alloc-h1", "username": name,
		"ssh_authorized_keys": []string{key}})
	if he != nil {
		t.Fatal(he)
	}
	res, ok := out.Output.(osuser.ProvisionResult)
	if !ok || !res.Created || res.Keys != 1 || !res.Verified.User || !res.Verified.Home || !res.Verified.AuthorizedKeys {
		t.Errorf("provision output = %#v", out.Output)
	}
	if _, ok := out.Timings["verify_ms"]; !ok {
		t.Errorf("timings = %v", out.Timings)
	}
	_, he = runAlloc(t, h, task.TypeAllocDeprovisionUser, map[string]any{"allocation_id": "alloc-other", "username": name})
	if he == nil || he.Code != osuser.CodeUserBoundToOtherAllocation {
		t.Errorf("deprovision by another allocation: %v", he)
	}
	out, he = runAlloc(t, h, task.TypeAllocDeprovisionUser, map[string]any{"allocation_id": "alloc-h1", "username": name})
	if he != nil {
		t.Fatal(he)
	}
	if d, ok := out.Output.(osuser.DeprovisionResult); !ok || !d.Removed || !d.HomeRemoved {
		t.Errorf("deprovision output = %#v", out.Output)
	}
	if _, err := user.Lookup(name); err == nil {
		t.Error("user still resolves")
	}
}
