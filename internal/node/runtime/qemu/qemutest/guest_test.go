package qemutest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/testutil"
)

// cpioEntry is one entry read back by readCPIO.
type cpioEntry struct {
	name         string
	mode         uint32
	rmaj, rmin   uint32
	data         []byte
	headerOffset int
}

// readCPIO parses a newc archive independently of the writer.
func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off+110 > len(b) {
			t.Fatalf("truncated header at %d", off)
		}
		h := string(b[off : off+110])
		if !strings.HasPrefix(h, "070701") {
			t.Fatalf("bad magic %q at %d", h[:6], off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(h[6+8*i:14+8*i], 16, 32)
			if err != nil {
				t.Fatalf("field %d: %v", i, err)
			}
			return uint32(v)
		}
		size, namesize := int(field(6)), int(field(11))
		nameEnd := off + 110 + namesize
		name := string(b[off+110 : nameEnd-1])
		if b[nameEnd-1] != 0 {
			t.Fatalf("name %q not NUL-terminated", name)
		}
		dataStart := align(nameEnd)
		e := cpioEntry{name: name, mode: field(1), rmaj: field(9), rmin: field(10),
			data: b[dataStart : dataStart+size], headerOffset: off}
		off = align(dataStart + size)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, e)
	}
}

func TestCPIOWriter(t *testing.T) {
	var buf bytes.Buffer
	c := newCPIOWriter(&buf)
	c.Dir("/bin", 0o755)
	c.File("bin/a", 0o644, []byte("x"))
	c.File("bin/bb", 0o755, []byte("12345"))
	c.Symlink("bin/sh", "busybox")
	c.CharDev("dev/console", 0o600, 5, 1)
	c.File("empty", 0o644, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got := readCPIO(t, buf.Bytes())
	want := []struct {
		name       string
		mode       uint32
		data       string
		rmaj, rmin uint32
	}{
		{"bin", modeDir | 0o755, "", 0, 0},
		{"bin/a", modeFile | 0o644, "x", 0, 0},
		{"bin/bb", modeFile | 0o755, "12345", 0, 0},
		{"bin/sh", modeSymlink | 0o777, "busybox", 0, 0},
		{"dev/console", modeCharDev | 0o600, "", 5, 1},
		{"empty", modeFile | 0o644, "", 0, 0},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.name != w.name || g.mode != w.mode || string(g.data) != w.data || g.rmaj != w.rmaj || g.rmin != w.rmin {
			t.Errorf("entry %d = %q %o %q %d:%d, want %q %o %q %d:%d", i, g.name, g.mode, g.data, g.rmaj, g.rmin,
				w.name, w.mode, w.data, w.rmaj, w.rmin)
		}
		if g.headerOffset%4 != 0 {
			t.Errorf("entry %q header at %d, not 4-aligned", g.name, g.headerOffset)
		}
	}
}

type errWriter struct{ n int }

func (w *errWriter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, io.ErrShortWrite
	}
	w.n--
	return len(p), nil
}

func TestCPIOWriterReportsWriteError(t *testing.T) {
	c := newCPIOWriter(&errWriter{n: 3})
	c.File("a", 0o644, []byte("data"))
	c.File("b", 0o644, []byte("data"))
	if err := c.Close(); err == nil {
		t.Fatal("Close returned nil after a failed write")
	}
}

func TestIsStatic(t *testing.T) {
	self, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Skip("no /bin/sh")
	}
	if isStatic(self) {
		t.Skip("/bin/sh is static here")
	}
	if isStatic([]byte("not an elf")) {
		t.Error("garbage reported as a static ELF")
	}
}

func TestInitramfsContents(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "evdev.ko")
	if err := os.WriteFile(mod, []byte("module"), 0o644); err != nil {
		t.Fatal(err)
	}
	gz, err := initramfs([]byte("BUSYBOX"), map[string]string{"evdev.ko": mod}, nil)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]cpioEntry{}
	for _, e := range readCPIO(t, raw) {
		byName[e.name] = e
	}
	for name, want := range map[string]string{
		"init": initScript(), "bin/busybox": "BUSYBOX", "bin/sh": "busybox", "lib/modules/evdev.ko": "module",
	} {
		if got := string(byName[name].data); got != want {
			t.Errorf("%s = %.40q, want %.40q", name, got, want)
		}
	}
	if e := byName["dev/console"]; e.mode != modeCharDev|0o600 || e.rmaj != 5 || e.rmin != 1 {
		t.Errorf("dev/console = %o %d:%d", e.mode, e.rmaj, e.rmin)
	}
}

// The guest must hold the power button's event device open before it
// prints the marker: evdev drops events nobody has open, so a
// system_powerdown sent as soon as the marker shows would otherwise be lost
// while the listener is still starting (TestGuestBootsAndPowersOff failed
// that way under load).
func TestInitListensBeforeMarker(t *testing.T) {
	s := initScript()
	open := strings.Index(s, `exec 3< "/dev/input/$ev"`)
	marker := strings.Index(s, `echo "$marker" > /dev/ttyS0`)
	read := strings.Index(s, "head -c 1 <&3")
	if open < 0 || marker < 0 || read < 0 || open > marker || read < marker {
		t.Errorf("init opens the button at %d, prints the marker at %d, reads the press at %d; "+
			"want open < marker < read:\n%s", open, marker, read, s)
	}
}

// bootResult is what a raw boot of the guest showed.
type bootResult struct {
	serial   string
	events   []string
	exitedIn time.Duration
}

// boot runs the guest under TCG (no runtime adapter), waits for the marker,
// then does action over QMP and waits for QEMU to exit.
func boot(t *testing.T, g Guest, extraCmdline string, extraArgs []string, during func(serialPath string), action string, exitWithin time.Duration) bootResult {
	t.Helper()
	dir, err := os.MkdirTemp("", "qt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	qmpPath, serialPath := filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "serial.log")
	args := append([]string{"-accel", "tcg", "-machine", "q35", "-m", "256", "-nodefaults", "-no-user-config",
		"-display", "none", "-monitor", "none",
		"-kernel", g.Kernel, "-initrd", g.Initrd, "-append", strings.TrimSpace(g.Cmdline + " " + extraCmdline),
		"-chardev", "file,id=ser0,path=" + serialPath, "-serial", "chardev:ser0",
		"-qmp", "unix:" + qmpPath + ",server=on,wait=off"}, extraArgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.QEMU, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var conn net.Conn
	for conn == nil {
		if conn, err = net.Dial("unix", qmpPath); err != nil {
			conn = nil
			if time.Since(start) > 10*time.Second {
				t.Fatalf("qmp: %v: %s", err, stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	defer func() { _ = conn.Close() }()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	send := func(cmd string) {
		if _, err := fmt.Fprintf(conn, `{"execute":%q}`+"\n", cmd); err != nil {
			t.Fatal(err)
		}
	}
	send("qmp_capabilities")

	marker := g.Marker
	if i := strings.Index(extraCmdline, KnobMarker+"="); i >= 0 {
		marker = strings.Fields(extraCmdline[i+len(KnobMarker)+1:])[0]
	}
	for {
		b, _ := os.ReadFile(serialPath)
		if bytes.Contains(b, []byte(marker)) {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("qemu exited before the marker: %v: %s\nserial: %s", err, stderr.String(), b)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("no marker %q after 60s; serial: %s", marker, b)
		}
	}
	t.Logf("marker after %v", time.Since(start))
	var res bootResult
	if during != nil {
		during(serialPath)
	}
	if action != "" {
		send(action)
	}
	t0 := time.Now()
	select {
	case err := <-exited:
		res.exitedIn = time.Since(t0)
		if err != nil {
			t.Logf("qemu exit: %v: %s", err, stderr.String())
		}
	case <-time.After(exitWithin):
		res.exitedIn = -1
	}
	_ = conn.Close()
	for l := range lines {
		var ev struct {
			Event string `json:"event"`
		}
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Event != "" {
			res.events = append(res.events, ev.Event)
		}
	}
	b, _ := os.ReadFile(serialPath)
	res.serial = string(b)
	return res
}

func TestGuestBootsAndPowersOff(t *testing.T) {
	g := Build(t, "")
	r := boot(t, g, "", nil, nil, "system_powerdown", 30*time.Second)
	if r.exitedIn < 0 {
		t.Fatalf("guest did not power off within 30s; serial: %s", r.serial)
	}
	if !strings.Contains(r.serial, PoweroffMarker) {
		t.Errorf("serial has no %q: %s", PoweroffMarker, r.serial)
	}
	if !contains(r.events, "SHUTDOWN") {
		t.Errorf("events %v lack SHUTDOWN", r.events)
	}
}

func TestGuestKnobs(t *testing.T) {
	g := Build(t, "")
	t.Run("nobutton", func(t *testing.T) {
		r := boot(t, g, KnobNoButton+" "+KnobMarker+"=OTHER-MARK", nil, nil, "system_powerdown", 3*time.Second)
		if r.exitedIn >= 0 {
			t.Fatalf("guest without the button module powered off; serial: %s", r.serial)
		}
	})
	t.Run("listen", func(t *testing.T) {
		if !g.CanNetwork {
			t.Skip("kernel has no virtio-net modules")
		}
		port := freePort(t)
		get := func(serialPath string) {
			deadline := time.Now().Add(30 * time.Second)
			for {
				b, _ := os.ReadFile(serialPath)
				if bytes.Contains(b, []byte(ListeningMarker)) {
					resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
					if err == nil {
						body, _ := io.ReadAll(resp.Body)
						_ = resp.Body.Close()
						if strings.TrimSpace(string(body)) == "ok" {
							return
						}
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no HTTP answer from the guest on port %d; serial: %s", port, b)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		boot(t, g, KnobListen+"=8080", []string{"-netdev", fmt.Sprintf("user,id=n0,hostfwd=tcp:127.0.0.1:%d-:8080", port),
			"-device", "virtio-net-pci,netdev=n0"}, get, "system_powerdown", 30*time.Second)
	})
	t.Run("crash", func(t *testing.T) {
		if !g.CanPanic {
			t.Skip("kernel has no pvpanic modules")
		}
		r := boot(t, g, KnobCrash, []string{"-device", "pvpanic-pci", "-action", "panic=shutdown"}, nil, "", 30*time.Second)
		if r.exitedIn < 0 {
			t.Fatalf("crashing guest did not exit; serial: %s", r.serial)
		}
		if !contains(r.events, "GUEST_PANICKED") {
			t.Errorf("events %v lack GUEST_PANICKED", r.events)
		}
	})
}

// freePort is a port for a guest's forward, below the ephemeral range
// (testutil.FreePort): a port from Listen(":0") can be taken by an
// outgoing connection before QEMU binds it.
func freePort(t *testing.T) int { return testutil.FreePort(t) }

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestBuildSkipsOrFailsInCI runs Build in a child process without QEMU on
// PATH: it must skip normally and fail when CI=true.
func TestBuildSkipsOrFailsInCI(t *testing.T) {
	if os.Getenv("QEMUTEST_CHILD") == "1" {
		Build(t, "")
		t.Fatal("Build returned without QEMU on PATH")
	}
	for _, tc := range []struct{ ci, want string }{{"", "--- SKIP"}, {"true", "--- FAIL"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBuildSkipsOrFailsInCI$", "-test.v")
		cmd.Env = append(os.Environ(), "QEMUTEST_CHILD=1", "CI="+tc.ci, "PATH="+t.TempDir())
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want+": TestBuildSkipsOrFailsInCI") || !strings.Contains(string(out), "not found on PATH") {
			t.Errorf("CI=%q: want %s with a clear message, got:\n%s", tc.ci, tc.want, out)
		}
	}
}
