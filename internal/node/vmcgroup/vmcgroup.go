// Package vmcgroup puts each VM process (QEMU, Firecracker) in its own
// memory cgroup under a Drover parent, with a memory limit, and tells
// afterwards whether the kernel OOM-killed something in it.
//
// Both hierarchies are handled:
//
//   - cgroup v2 (a unified mount with the memory controller):
//     <root>/<parent>/<id>, memory.max, memory.swap.max = 0,
//     memory.events "oom_kill N";
//   - cgroup v1 (a memory controller mount, as this project's hosts have):
//     <root>/<parent>/<id> under /sys/fs/cgroup/memory,
//     memory.limit_in_bytes (and memory.memsw.limit_in_bytes where swap
//     accounting exists), memory.oom_control "oom_kill N".
//
// Use:
//
//	m, err := vmcgroup.New(vmcgroup.Options{})        // detects v2 or v1
//	g, err := m.Create(id, limitBytes)                // before or right after the VMM starts
//	err = g.AddProcess(pid)                           // the VMM (QEMU's daemonized pid)
//	…the process exits…
//	if oom, _ := g.OOMKilled(); oom { reason = api.ReasonOOMKilled }
//	err = g.Remove()                                  // on exit or destroy
//	removed, err := m.Reconcile(liveIDs)              // at agent start: orphans
//
// A process moved in after it started keeps what it allocated before in
// its old cgroup (v1 does not move charges; v2 never does); a daemonized
// QEMU allocates guest RAM lazily, after the move. Errors are plain
// wrapped errors: the caller picks the reason code (vm_start_failed).
// Hosts without a memory controller get ErrUnsupported from New.
package vmcgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

// DefaultParent is the cgroup under which VM cgroups are made.
const DefaultParent = "drover"

// ErrUnsupported: no memory cgroup controller is mounted (or not Linux).
var ErrUnsupported = errors.New("memory cgroups are not supported on this host")

// Options choose the hierarchy; the zero value detects it.
type Options struct {
	// Root is the memory controller's mount (v1: /sys/fs/cgroup/memory) or
	// the unified mount (v2: /sys/fs/cgroup); empty detects it.
	Root string
	// V2 says Root is a unified (v2) mount; set with Root.
	V2 bool
	// Parent is the directory under Root holding VM cgroups (default
	// DefaultParent; tests use their own).
	Parent string
}

// Manager makes and finds VM cgroups.
type Manager struct {
	dir string // <root>/<parent>
	v2  bool
}

// Group is one VM's cgroup.
type Group struct {
	Path string
	v2   bool
}

var validID = pattern.Must(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`, `^[A-Za-z0-9][A-Za-z0-9_.-]*$`, 1, 128)

// Detect finds the memory controller: v2 when the unified hierarchy at
// /sys/fs/cgroup offers "memory", else v1 at /sys/fs/cgroup/memory.
func Detect() (root string, v2 bool, err error) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil &&
		strings.Contains(" "+strings.TrimSpace(string(b))+" ", " memory ") {
		return "/sys/fs/cgroup", true, nil
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		return "/sys/fs/cgroup/memory", false, nil
	}
	return "", false, ErrUnsupported
}

// New finds the hierarchy and makes the parent cgroup (on v2 with the
// memory controller enabled for its children).
func New(o Options) (*Manager, error) {
	if o.Root == "" {
		root, v2, err := Detect()
		if err != nil {
			return nil, err
		}
		o.Root, o.V2 = root, v2
	}
	if o.Parent == "" {
		o.Parent = DefaultParent
	}
	if !validID.MatchString(o.Parent) {
		return nil, fmt.Errorf("cgroup parent %q: not a plain name", o.Parent)
	}
	m := &Manager{dir: filepath.Join(o.Root, o.Parent), v2: o.V2}
	if err := os.Mkdir(m.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create cgroup %s: %w", m.dir, err)
	}
	if m.v2 {
		// Children of root and parent need the memory controller.
		for _, d := range []string{o.Root, m.dir} {
			if err := writeFile(filepath.Join(d, "cgroup.subtree_control"), "+memory"); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// Dir is the parent cgroup's directory.
func (m *Manager) Dir() string { return m.dir }

// Group returns id's cgroup (it may not exist).
func (m *Manager) Group(id string) (*Group, error) {
	if !validID.MatchString(id) {
		return nil, fmt.Errorf("cgroup for %q: not a plain name", id)
	}
	return &Group{Path: filepath.Join(m.dir, id), v2: m.v2}, nil
}

// Create makes id's cgroup (or reuses an existing one, counters included:
// call Remove first for fresh ones) with a memory limit of limitBytes
// (<= 0: none) and swap disallowed where the host accounts it.
func (m *Manager) Create(id string, limitBytes int64) (*Group, error) {
	g, err := m.Group(id)
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(g.Path, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create cgroup %s: %w", g.Path, err)
	}
	if limitBytes <= 0 {
		return g, nil
	}
	lim := strconv.FormatInt(limitBytes, 10)
	if g.v2 {
		if err := writeFile(filepath.Join(g.Path, "memory.max"), lim); err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(g.Path, "memory.swap.max")); err == nil {
			if err := writeFile(filepath.Join(g.Path, "memory.swap.max"), "0"); err != nil {
				return nil, err
			}
		}
		return g, nil
	}
	if err := writeFile(filepath.Join(g.Path, "memory.limit_in_bytes"), lim); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(g.Path, "memory.memsw.limit_in_bytes")); err == nil {
		if err := writeFile(filepath.Join(g.Path, "memory.memsw.limit_in_bytes"), lim); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// AddProcess moves pid (all its threads) into the cgroup.
func (g *Group) AddProcess(pid int) error {
	return writeFile(filepath.Join(g.Path, "cgroup.procs"), strconv.Itoa(pid))
}

// Procs lists the pids in the cgroup.
func (g *Group) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.Path, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// OOMKills is the number of processes the kernel OOM-killed in the cgroup
// (v2 memory.events, v1 memory.oom_control "oom_kill").
func (g *Group) OOMKills() (int64, error) {
	name := "memory.oom_control"
	if g.v2 {
		name = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(g.Path, name))
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "oom_kill" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", name, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s has no oom_kill counter (kernel older than 4.13?)", name)
}

// OOMKilled reports whether the kernel OOM-killed a process in the cgroup.
func (g *Group) OOMKilled() (bool, error) {
	n, err := g.OOMKills()
	return n > 0, err
}

// Remove deletes the cgroup; a missing one is fine. A process that just
// exited can keep it busy until it is reaped, so EBUSY is retried for up to
// removeWait; past that (processes remain) it fails.
func (g *Group) Remove() error {
	deadline := time.Now().Add(removeWait)
	for {
		err := os.Remove(g.Path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", g.Path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeWait bounds Remove's retries of a busy cgroup.
const removeWait = 3 * time.Second

// Reconcile removes the cgroups of ids not in live that hold no process
// (a process still in one is left for its runtime's recovery to kill),
// and returns the ids removed.
func (m *Manager) Reconcile(live []string) ([]string, error) {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return nil, fmt.Errorf("list cgroups: %w", err)
	}
	alive := map[string]bool{}
	for _, id := range live {
		alive[id] = true
	}
	var removed []string
	for _, e := range ents {
		if !e.IsDir() || alive[e.Name()] {
			continue
		}
		g := &Group{Path: filepath.Join(m.dir, e.Name()), v2: m.v2}
		if procs, err := g.Procs(); err != nil || len(procs) > 0 {
			continue
		}
		if err := g.Remove(); err != nil {
			return removed, err
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

// RemoveParent deletes the (empty) parent cgroup; for tests and uninstall.
func (m *Manager) RemoveParent() error {
	if err := os.Remove(m.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s: %w", m.dir, err)
	}
	return nil
}

func writeFile(path, val string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroup write %q to %s: %w", val, path, err)
	}
	return nil
}
