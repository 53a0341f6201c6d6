//go:build linux

package firecracker

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/drover-dev/drover/internal/node/guestinit"
	"github.com/drover-dev/drover/internal/node/netsetup"
	"github.com/drover-dev/drover/internal/node/oci"
	"github.com/drover-dev/drover/internal/node/ocitest"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// need fails a test (under CI=true) or skips it when the host lacks what
// it needs.
func need(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// newNetNS is a fresh unnamed network namespace with lo up (gone when the
// test ends): netsetup's bridge, taps and rules live in it.
func newNetNS(t *testing.T) netns.NsHandle {
	t.Helper()
	need(t, os.Geteuid() == 0, "network namespaces need root")
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		t.Fatal(err)
	}
	defer func() { _ = orig.Close() }()
	ns, err := netns.New()
	if err != nil {
		goruntime.UnlockOSThread()
		need(t, false, "create network namespace: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the test's namespace: %v", err) // the thread stays locked
	}
	goruntime.UnlockOSThread()
	t.Cleanup(func() { _ = ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func linkExists(t *testing.T, ns netns.NsHandle, name string) bool {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	_, err = h.LinkByName(name)
	return err == nil
}

// guestEnv is a Runtime that boots OCI images: the real OCI store pulling
// from an in-test registry on loopback (mkfs.ext4 builds the rootfs), real
// netsetup in a namespace of the test's own, and the contract server as
// the firecracker binary. The kernel and initrd are files the contract
// server checks exist and never boots.
type guestEnv struct {
	*testEnv
	r     *Runtime
	store *oci.Store
	ns    netns.NsHandle
	img   ocitest.Image
	secd  string
}

func newGuestEnv(t *testing.T) *guestEnv {
	t.Helper()
	_, err := os.Stat(ocitest.Busybox)
	need(t, err == nil, "the test image needs %s (busybox-static)", ocitest.Busybox)
	need(t, haveMkfs(), "the OCI rootfs needs mkfs.ext4 (e2fsprogs)")
	g := &guestEnv{testEnv: newTestEnv(t), ns: newNetNS(t)}
	reg := ocitest.StartRegistry()
	t.Cleanup(reg.Close)
	if g.img, err = reg.Push("drover/fc", "v1", "", "FROM_IMAGE=1"); err != nil {
		t.Fatal(err)
	}
	if g.store, err = oci.New(oci.Options{Dir: filepath.Join(g.root, "oci"), AllowLocalURLs: true, Log: discardLog()}); err != nil {
		t.Fatal(err)
	}
	nm, err := netsetup.New(netsetup.Config{Bridge: "drfct0", CIDR: "10.97.0.0/24", StateDir: t.TempDir(),
		NetNSPath: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(g.ns))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nm.Close() })
	kernel := filepath.Join(g.files, "vmlinux-not-booted")
	initrd := filepath.Join(g.files, "drover-init-initramfs-not-booted")
	for _, p := range []string{kernel, initrd} {
		if err := os.WriteFile(p, []byte("never booted: the contract server only checks the file exists\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g.secd = tmpfsDir(t)
	taps := NewNetsetupTaps(nm)
	g.r = g.runtime(t, func(o *Options) {
		o.Taps = taps
		o.Guest = &GuestOptions{Kernel: kernel, Initrd: initrd, OCI: g.store, Net: taps, SecretDir: g.secd}
	})
	return g
}

func haveMkfs() bool {
	for _, p := range []string{"mkfs.ext4", "/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
		if strings.Contains(p, "/") {
			continue
		}
		for _, d := range filepath.SplitList(os.Getenv("PATH")) {
			if _, err := os.Stat(filepath.Join(d, p)); err == nil {
				return true
			}
		}
	}
	return false
}

// tmpfsDir is a fresh directory on a tmpfs (/dev/shm or /run).
func tmpfsDir(t *testing.T) string {
	t.Helper()
	base := defaultSecretDir()
	need(t, base != "", "no tmpfs at /run or /dev/shm")
	d, err := os.MkdirTemp(filepath.Dir(base), "drover-fc-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// ociSpec is an OCI instance with a command, env, a secret and a bridge
// network, ready at the contract server's boot line.
func (g *guestEnv) ociSpec(id string) runtime.Spec {
	return runtime.Spec{ID: id, Owner: "reconciler",
		Image:     runtime.Image{Kind: runtime.ImageOCI, Ref: g.img.Ref},
		Command:   []string{"/bin/sh", "-c"},
		Args:      []string{"echo hello; sleep 3600"},
		Env:       map[string]string{"GREETING": "hi"},
		Secrets:   map[string][]byte{"db_password": []byte("s3cret-value")},
		Resources: runtime.Resources{VCPUs: 1, MemoryMiB: 128},
		Readiness: runtime.Readiness{Readiness: api.Readiness{SerialMarker: fakeBootedMsg}},
		VM:        &runtime.VMSpec{Network: runtime.VMNetwork{Mode: api.NetworkBridge}}}
}

// TestOCIImageContract: an OCI image goes through the real OCI store (an
// in-test registry, mkfs.ext4) to a per-instance copy of its cached ext4,
// a guestinit config drive (command, env, secrets, the address netsetup
// leased) in a 0600 file on a tmpfs, and a tap netsetup made on its bridge;
// Start sends the two drives, the tap, MMDS (no secrets) and vsock to the
// contract server, which validates each request against Firecracker's
// API specification. Nothing boots: this stops where Firecracker would.
func TestOCIImageContract(t *testing.T) {
	g := newGuestEnv(t)
	if n := g.r.Names(); !slices.Equal(n, []string{Name, api.RuntimeMicroVM}) {
		t.Errorf("names %v: a runtime with a guest kernel runs runtime microvm too", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const id = "oci-1"
	st, err := g.r.Create(ctx, g.ociSpec(id))
	if err != nil {
		t.Fatal(err)
	}
	in := g.r.get(id)
	ps := in.st
	lease := ociLease(t, g, id)

	// The rootfs: a copy of the store's ext4 for this digest.
	cached := g.store.RootfsPath(g.img.Digest)
	if st.Overlay != ps.Rootfs || ps.Rootfs == cached {
		t.Fatalf("rootfs %s (overlay %s), want a copy of %s", ps.Rootfs, st.Overlay, cached)
	}
	if !isExt4(t, ps.Rootfs) {
		t.Errorf("%s is not an ext4 image", ps.Rootfs)
	}
	if lz := g.store.Leases(); lz[id] == "" {
		t.Errorf("OCI store leases %v: want one for %s", lz, id)
	}

	// The config drive.
	if want := filepath.Join(g.secd, id, configName); ps.Config != want || !ps.ConfigTmpfs {
		t.Errorf("config drive %s (tmpfs %v), want %s on the tmpfs", ps.Config, ps.ConfigTmpfs, want)
	}
	fi, err := os.Stat(ps.Config)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config drive: %v, mode %v; want 0600", err, fi.Mode())
	}
	f, err := os.Open(ps.Config)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := guestinit.DecodeConfig(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Argv(), " "); got != "/bin/sh -c echo hello; sleep 3600" {
		t.Errorf("argv %q", got)
	}
	env := strings.Join(cfg.Env, " ")
	if !strings.Contains(env, "GREETING=hi") || !strings.Contains(env, "FROM_IMAGE=1") {
		t.Errorf("env %v: want the image's and the spec's", cfg.Env)
	}
	if string(cfg.Secrets["db_password"]) != "s3cret-value" || cfg.Hostname != id {
		t.Errorf("secrets %v hostname %q", cfg.Secrets, cfg.Hostname)
	}
	wantNet := guestinit.Network{Address: fmt.Sprintf("%s/%d", lease.IP, lease.Prefix), Gateway: lease.Gateway.String(), DNS: lease.DNS[0].String()}
	if cfg.Network == nil || *cfg.Network != wantNet {
		t.Errorf("config drive network %+v, want %+v", cfg.Network, wantNet)
	}
	for _, p := range []string{filepath.Join(in.dir, stateFile), filepath.Join(in.dir, specFile)} {
		if b, _ := os.ReadFile(p); strings.Contains(string(b), "s3cret-value") {
			t.Errorf("%s holds the secret", p)
		}
	}
	if !linkExists(t, g.ns, lease.Tap) {
		t.Errorf("tap %s not on the host (netsetup did not make it)", lease.Tap)
	}

	// Start: every request against the spec, and what they carried.
	if _, err := g.r.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", 30*time.Second, func() bool { s, _ := g.r.Inspect(ctx, id); return s.Ready })
	if s, _ := g.r.Inspect(ctx, id); s.State != runtime.StateRunning {
		t.Fatalf("after Start: %s", s.State)
	}
	bodies := map[string]string{}
	for _, q := range g.requests(t) {
		bodies[q.Method+" "+q.Path] = string(q.Body)
	}
	for key, subs := range map[string][]string{
		"PUT /boot-source":             {`"kernel_image_path":"` + ps.Kernel + `"`, `"initrd_path":"` + ps.Initrd + `"`, `"boot_args":"` + GuestBootArgs + `"`},
		"PUT /drives/rootfs":           {`"is_root_device":true`, `"is_read_only":false`, `"path_on_host":"` + ps.Rootfs + `"`},
		"PUT /drives/config":           {`"is_root_device":false`, `"is_read_only":true`, `"path_on_host":"` + ps.Config + `"`},
		"PUT /network-interfaces/eth0": {`"host_dev_name":"` + lease.Tap + `"`, `"guest_mac":"` + lease.MAC + `"`},
		"PUT /mmds/config":             {`"version":"V2"`, `"network_interfaces":["eth0"]`},
		"PUT /mmds":                    {`"instance_id":"` + id + `"`, `"local_ipv4":"` + lease.IP.String() + `"`},
		"PUT /vsock":                   {fmt.Sprintf(`"guest_cid":%d`, vsockCID(id)), `"uds_path":"` + filepath.Join(in.dir, vsockName) + `"`},
	} {
		b, ok := bodies[key]
		if !ok {
			t.Errorf("no %s request", key)
			continue
		}
		for _, s := range subs {
			if !strings.Contains(b, s) {
				t.Errorf("%s body %s: want %s", key, b, s)
			}
		}
	}
	for key, b := range bodies {
		for _, leak := range []string{"s3cret-value", "db_password", "GREETING"} {
			if strings.Contains(b, leak) {
				t.Errorf("%s carries %q: secrets and env travel on the config drive only", key, leak)
			}
		}
	}

	// Stop and Destroy free the tap, the address, the drive and the image.
	if res, err := g.r.Stop(ctx, id, 10*time.Second); err != nil || res.HardStopped {
		t.Fatalf("Stop = %+v, %v", res, err)
	}
	if err := g.r.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if linkExists(t, g.ns, lease.Tap) {
		t.Errorf("tap %s left after Destroy", lease.Tap)
	}
	if _, err := os.Stat(filepath.Dir(ps.Config)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("config drive dir after Destroy: %v", err)
	}
	if lz := g.store.Leases(); lz[id] != "" {
		t.Errorf("OCI lease of %s kept after Destroy", id)
	}
}

// ociLease is what netsetup leased to id, read back from its state.
func ociLease(t *testing.T, g *guestEnv, id string) netsetup.Lease {
	t.Helper()
	l, err := g.r.opts.Taps.(*NetsetupTaps).m.Attach(context.Background(), id, nil) // idempotent: the same lease
	if err != nil {
		t.Fatal(err)
	}
	if g.r.get(id).st.Tap != l.Tap || g.r.get(id).st.GuestIP != l.IP.String() {
		t.Fatalf("instance state tap %s ip %s, lease %+v", g.r.get(id).st.Tap, g.r.get(id).st.GuestIP, l)
	}
	return l
}

// isExt4 checks the ext4 superblock magic (0xEF53 at byte 1080).
func isExt4(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 1080); err != nil {
		return false
	}
	return binary.LittleEndian.Uint16(b) == 0xEF53
}

// TestOCIStartFailures: firecracker_start_failed from the adapter's real
// failure paths, each carrying the step and the tail of firecracker's log:
// a firecracker that exits before its API answers, and an API that
// rejects the config drive (as Firecracker does for a drive it cannot
// open). The instance stays created and no process is left.
func TestOCIStartFailures(t *testing.T) {
	cases := []struct {
		name  string
		env   []string
		wants []string
	}{
		{"exits early", []string{fakeExitEnv + "=Error: Failed to open /dev/kvm: Permission denied (os error 13)"},
			[]string{"api socket", "exited before its API answered", "Failed to open /dev/kvm"}},
		{"config drive refused", []string{fakeFailEnv + "=PUT /drives/config", fakeFaultEnv + "=Unable to create the block device: No such file or directory"},
			[]string{"configure", "drives/config", "400", "Unable to create the block device", "fc_api"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuestEnv(t)
			g.r.opts.Binary = writeFakeBinary(t, g.testEnv, tc.env...)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if _, err := g.r.Create(ctx, g.ociSpec("bad-oci")); err != nil {
				t.Fatal(err)
			}
			_, err := g.r.Start(ctx, "bad-oci")
			if runtime.ReasonOf(err, "") != api.ReasonFirecrackerStartFailed {
				t.Fatalf("Start = %v, want firecracker_start_failed", err)
			}
			for _, s := range tc.wants {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Start error %q: want %q", err, s)
				}
			}
			if s, _ := g.r.Inspect(ctx, "bad-oci"); s.State != runtime.StateCreated || s.PID != 0 {
				t.Errorf("after the failed start: %+v", s)
			}
			if left := scanProcs(g.r.instDir); len(left) != 0 {
				t.Errorf("processes left: %v", left)
			}
			b, _ := json.Marshal(g.requests(t))
			if strings.Contains(string(b), "s3cret-value") {
				t.Error("a request carried the secret")
			}
		})
	}
}

// TestDefaultSecretDir: the default home of a config drive with secrets is
// on a tmpfs.
func TestDefaultSecretDir(t *testing.T) {
	d := defaultSecretDir()
	need(t, d != "", "no tmpfs at /run or /dev/shm")
	if !isTmpfs(filepath.Dir(d)) {
		t.Errorf("%s is not on a tmpfs", d)
	}
}
