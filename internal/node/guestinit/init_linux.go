//go:build linux

package guestinit

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ModulesDir holds the initramfs's kernel modules and their load order.
const ModulesDir = ModulesDirPath

// console is where reports and the init's own messages go.
var console *os.File

func logf(format string, args ...any) {
	if console != nil {
		fmt.Fprintf(console, "drover-init: "+format+"\r\n", args...)
	}
}

func report(r Report) {
	r.UptimeMS = uptimeMS()
	if console != nil {
		_, _ = console.WriteString("\r\n" + r.Line())
	}
}

// Main is PID 1. It never returns: it powers the VM off.
func Main() {
	console, _ = os.OpenFile("/dev/console", os.O_RDWR, 0)
	if console == nil {
		_ = os.MkdirAll("/dev", 0o755)
		_ = unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
		console, _ = os.OpenFile("/dev/console", os.O_RDWR, 0)
	}
	code, err := run()
	if err != nil {
		logf("%v", err)
		report(Report{Event: EventFailed, ExitCode: 127, Error: err.Error()})
	}
	_ = code
	unix.Sync()
	unmountVolumes()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Power off failed: a reset ends QEMU run with -no-reboot.
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

// run does everything up to the workload's end and returns its code.
func run() (int, error) {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return 0, fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loadModules(); err != nil {
		return 0, err
	}
	disks, err := waitDisks([]string{RootSerial, ConfigSerial}, 20*time.Second)
	if err != nil {
		return 0, err
	}
	f, err := os.Open(disks[ConfigSerial])
	if err != nil {
		return 0, fmt.Errorf("config drive: %w", err)
	}
	cfg, err := DecodeConfig(f)
	_ = f.Close()
	if err != nil {
		return 0, err
	}
	if err := switchRoot(disks[RootSerial]); err != nil {
		return 0, err
	}
	if err := setup(cfg); err != nil {
		return 0, err
	}
	return supervise(cfg)
}

// loadModules loads the modules named in ModulesDir/order, in order.
func loadModules() error {
	order, err := os.ReadFile(filepath.Join(ModulesDir, "order"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel with the drivers built in
	}
	if err != nil {
		return err
	}
	// Load in order, and again those that failed (an unknown symbol is
	// ENOENT: a dependency listed later), while that makes progress.
	pending := strings.Fields(string(order))
	errs := map[string]error{}
	for len(pending) > 0 {
		var again []string
		for _, name := range pending {
			f, err := os.Open(filepath.Join(ModulesDir, name))
			if err != nil {
				return fmt.Errorf("module %s: %w", name, err)
			}
			err = unix.FinitModule(int(f.Fd()), "", 0)
			_ = f.Close()
			if err != nil && !errors.Is(err, unix.EEXIST) {
				again, errs[name] = append(again, name), err
			}
		}
		if len(again) == len(pending) {
			for _, name := range again {
				logf("module %s: %v", name, errs[name]) // a missing device is no reason to stop
			}
			break
		}
		pending = again
	}
	return nil
}

// waitDisks finds the virtio disks with the given serials, or at the
// device paths the kernel command line names for them (DisksFromCmdline).
func waitDisks(serials []string, d time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(d)
	cmdline, _ := os.ReadFile("/proc/cmdline")
	named := DisksFromCmdline(string(cmdline))
	for {
		found := map[string]string{}
		for serial, dev := range named {
			if _, err := os.Stat(dev); err == nil {
				found[serial] = dev
			}
		}
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
			if s := strings.TrimSpace(string(b)); err == nil && found[s] == "" {
				found[s] = "/dev/" + e.Name()
			}
		}
		missing := []string{}
		for _, s := range serials {
			if found[s] == "" {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			return found, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("disks %v not found (have %v)", missing, found)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// switchRoot mounts dev at /newroot and makes it the root, as
// switch_root does (the initramfs's files stay: they are small).
func switchRoot(dev string) error {
	if err := os.MkdirAll("/newroot", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, "/newroot", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount root %s: %w", dev, err)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		_ = os.MkdirAll("/newroot"+d, 0o755)
		if err := unix.Mount(d, "/newroot"+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chdir("/")
}

// setup mounts the rest, writes secrets, mounts volumes, sets the
// hostname and the network.
func setup(cfg Config) error {
	for _, m := range []struct {
		src, dst, fs, data string
		flags              uintptr
	}{
		{"devpts", "/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "/run", "tmpfs", "mode=0755", unix.MS_NOSUID | unix.MS_NODEV},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, m.flags, m.data); err != nil {
			logf("mount %s: %v", m.dst, err)
		}
	}
	// ctrl-alt-del sends SIGINT to PID 1 instead of rebooting.
	_ = os.WriteFile("/proc/sys/kernel/ctrl-alt-del", []byte("0"), 0o644)
	if err := writeSecrets(cfg.Secrets); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	for _, v := range cfg.Volumes {
		if err := mountVolume(v); err != nil {
			return err
		}
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
	}
	if err := ifUp("lo", "", ""); err != nil {
		logf("lo: %v", err)
	}
	if n := cfg.Network; n != nil {
		if err := ifUp("eth0", n.Address, n.Gateway); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		if rc := n.ResolvConf(); rc != nil {
			_ = os.WriteFile("/etc/resolv.conf", rc, 0o644)
		}
	}
	return nil
}

// writeSecrets puts each secret into SecretsDir (a tmpfs), 0400. Their
// names and values are never logged.
func writeSecrets(s map[string][]byte) error {
	if len(s) == 0 {
		return nil
	}
	if err := os.MkdirAll(SecretsDir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", SecretsDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0711"); err != nil {
		return err
	}
	for n, v := range s {
		if err := os.WriteFile(filepath.Join(SecretsDir, n), v, 0o400); err != nil {
			return err
		}
	}
	return nil
}

// mountVolume mounts a volume; its errors start with VolumeErrorPrefix.
func mountVolume(v Volume) error {
	disks, err := waitDisks([]string{v.Serial}, 10*time.Second)
	if err != nil {
		return fmt.Errorf(VolumeErrorPrefix+"%s: %w", v.Target, err)
	}
	fstype := v.FSType
	if fstype == "" {
		fstype = "ext4"
	}
	var flags uintptr
	if v.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := os.MkdirAll(v.Target, 0o755); err != nil {
		return fmt.Errorf(VolumeErrorPrefix+"%s: %w", v.Target, err)
	}
	err = unix.Mount(disks[v.Serial], v.Target, fstype, flags, "")
	if errors.Is(err, unix.EROFS) && v.ReadOnly && fstype == "ext4" {
		// The last writer did not unmount it (a hard stop): its journal
		// needs a replay a read-only disk cannot take. Mount without it.
		logf("volume %s: its journal is not replayed (read-only disk; the last writer stopped uncleanly)", v.Target)
		err = unix.Mount(disks[v.Serial], v.Target, fstype, flags, "noload")
	}
	if err != nil {
		return fmt.Errorf(VolumeErrorPrefix+"%s: mount %s: %w", v.Target, disks[v.Serial], err)
	}
	volumeMounts = append(volumeMounts, v.Target)
	return nil
}

// volumeMounts are the volumes mountVolume mounted, in order.
var volumeMounts []string

// unmountVolumes unmounts the volumes before the power goes off, so each
// journal is clean (a read-only mount elsewhere needs no replay). The
// workload's processes were killed just before; one still exiting keeps
// a volume busy for a moment, so each try is repeated for up to a second,
// and a volume that stays busy is remounted read-only (also clean).
func unmountVolumes() {
	for i := len(volumeMounts) - 1; i >= 0; i-- {
		t := volumeMounts[i]
		var err error
		for try := 0; try < 20; try++ {
			if err = unix.Unmount(t, 0); err == nil || !errors.Is(err, unix.EBUSY) {
				break
			}
			reapZombies()
			time.Sleep(50 * time.Millisecond)
		}
		if errors.Is(err, unix.EBUSY) {
			err = unix.Mount("", t, "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
		}
		if err != nil {
			logf("volume %s: unmount: %v", t, err)
		}
	}
}

// reapZombies collects exited children without waiting.
func reapZombies() {
	for {
		var ws unix.WaitStatus
		if pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 || err != nil {
			return
		}
	}
}

// ifUp brings an interface up with an IPv4 address (CIDR) and a default
// route, by ioctl (no netlink library, no ip tool).
func ifUp(name, cidr, gw string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	var ifr *unix.Ifreq
	for i := 0; ; i++ { // the NIC's driver may still be probing
		if ifr, err = unix.NewIfreq(name); err != nil {
			return err
		}
		if err = unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err == nil || i >= 200 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if cidr != "" {
		ip, ipn, err := net.ParseCIDR(cidr)
		if err != nil || ip.To4() == nil {
			return fmt.Errorf("address %q: want IPv4 CIDR", cidr)
		}
		a, _ := unix.NewIfreq(name)
		if err := a.SetInet4Addr(ip.To4()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, a); err != nil {
			return fmt.Errorf("%s address: %w", name, err)
		}
		m, _ := unix.NewIfreq(name)
		if err := m.SetInet4Addr(net.IP(ipn.Mask).To4()); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, m); err != nil {
			return fmt.Errorf("%s netmask: %w", name, err)
		}
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	if gw != "" {
		if err := addDefaultRoute(fd, net.ParseIP(gw).To4()); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	return nil
}

// addDefaultRoute is SIOCADDRT with a struct rtentry (64-bit layout).
func addDefaultRoute(fd int, gw net.IP) error {
	if gw == nil {
		return errors.New("not an IPv4 address")
	}
	var rt [120]byte // struct rtentry on LP64
	sin := func(off int, ip net.IP) {
		binary.LittleEndian.PutUint16(rt[off:], unix.AF_INET)
		copy(rt[off+4:off+8], ip)
	}
	sin(8, net.IPv4zero.To4())                                           // rt_dst
	sin(24, gw)                                                          // rt_gateway
	sin(40, net.IPv4zero.To4())                                          // rt_genmask
	binary.LittleEndian.PutUint16(rt[56:], unix.RTF_UP|unix.RTF_GATEWAY) // rt_flags
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCADDRT, uintptr(unsafe.Pointer(&rt[0])))
	if errno != 0 && errno != unix.EEXIST {
		return errno
	}
	return nil
}

// supervise starts the workload, reaps every child, forwards stop
// requests, and reports the workload's end.
func supervise(cfg Config) (int, error) {
	passwd, _ := os.ReadFile("/etc/passwd")
	group, _ := os.ReadFile("/etc/group")
	id, err := LookupUser(cfg.User, passwd, group)
	if err != nil {
		return 0, err
	}
	env := cfg.Env
	if !hasEnv(env, "PATH") {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	if !hasEnv(env, "HOME") {
		env = append(env, "HOME="+id.Home)
	}
	if !hasEnv(env, "HOSTNAME") {
		if h, err := os.Hostname(); err == nil {
			env = append(env, "HOSTNAME="+h)
		}
	}
	argv := cfg.Argv()
	bin, err := lookPath(argv[0], env, cfg.WorkingDir)
	if err != nil {
		return 0, err
	}
	dir := cfg.WorkingDir
	if dir == "" {
		dir = "/"
	}
	_ = os.MkdirAll(dir, 0o755)
	if len(cfg.Secrets) > 0 {
		_ = os.Chown(SecretsDir, int(id.UID), int(id.GID))
		for n := range cfg.Secrets {
			_ = os.Chown(filepath.Join(SecretsDir, n), int(id.UID), int(id.GID))
		}
	}

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGPWR)
	stopReq := make(chan struct{}, 1)
	go watchPowerButton(stopReq)

	null, _ := os.Open("/dev/null")
	oomBefore := oomKills()
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Files: []uintptr{null.Fd(), console.Fd(), console.Fd()},
		Sys: &syscall.SysProcAttr{Setsid: true}}
	if id.UID != 0 || id.GID != 0 || len(id.Groups) > 0 {
		attr.Sys.Credential = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: id.Groups}
	}
	pid, err := syscall.ForkExec(bin, argv, attr)
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	report(Report{Event: EventStarted, PID: pid})
	stopping := false
	for {
		select {
		case s := <-sigs:
			if s != unix.SIGCHLD {
				stopping = forward(pid, stopping)
				continue
			}
		case <-stopReq:
			stopping = forward(pid, stopping)
			continue
		}
		for {
			var ws unix.WaitStatus
			wpid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if wpid <= 0 || err != nil {
				break
			}
			if wpid != pid {
				continue
			}
			r := Report{Event: EventExited, PID: pid, ExitCode: ws.ExitStatus()}
			if ws.Signaled() {
				r.Signal = unix.SignalName(ws.Signal())
				r.ExitCode = 128 + int(ws.Signal())
				r.OOMKilled = ws.Signal() == unix.SIGKILL && oomKills() > oomBefore
			}
			// Give the workload's other processes a moment to end.
			_ = unix.Kill(-1, unix.SIGTERM)
			time.Sleep(100 * time.Millisecond)
			_ = unix.Kill(-1, unix.SIGKILL)
			report(r)
			return r.ExitCode, nil
		}
	}
}

// forward passes a stop request to the workload as SIGTERM; a second
// request while stopping is SIGKILL.
func forward(pid int, stopping bool) bool {
	sig := unix.SIGTERM
	if stopping {
		sig = unix.SIGKILL
	}
	logf("stop requested: sending %s to the workload", unix.SignalName(sig))
	_ = unix.Kill(pid, sig)
	return true
}

// watchPowerButton waits for the ACPI power button's key press (QMP
// system_powerdown) on its evdev device and asks for a stop.
func watchPowerButton(stop chan<- struct{}) {
	var dev string
	for i := 0; i < 200 && dev == ""; i++ {
		ents, _ := os.ReadDir("/sys/class/input")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/class/input", e.Name(), "device/name"))
			if err == nil && strings.TrimSpace(string(b)) == "Power Button" && strings.HasPrefix(e.Name(), "event") {
				dev = "/dev/input/" + e.Name()
			}
		}
		if dev == "" {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if dev == "" {
		logf("no power button: graceful stop only by SIGTERM/ctrl-alt-del")
		return
	}
	f, err := os.Open(dev)
	if err != nil {
		logf("power button: %v", err)
		return
	}
	ev := make([]byte, 24) // struct input_event on LP64
	for {
		if _, err := f.Read(ev); err != nil {
			return
		}
		typ, code, val := binary.LittleEndian.Uint16(ev[16:]), binary.LittleEndian.Uint16(ev[18:]), int32(binary.LittleEndian.Uint32(ev[20:]))
		if typ == 1 && code == 116 && val == 1 { // EV_KEY KEY_POWER pressed
			select {
			case stop <- struct{}{}:
			default:
			}
		}
	}
}

func hasEnv(env []string, k string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, k+"=") {
			return true
		}
	}
	return false
}

// lookPath finds argv0 in the workload's PATH.
func lookPath(argv0 string, env []string, dir string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("entrypoint %s: %w", argv0, err)
		}
		return p, nil
	}
	path := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, argv0)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("entrypoint %s: not found in PATH %s", argv0, path)
}

// oomKills is the kernel's OOM kill counter (/proc/vmstat oom_kill).
func oomKills() int64 {
	b, _ := os.ReadFile("/proc/vmstat")
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}

func uptimeMS() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return ts.Nano() / int64(time.Millisecond)
}
