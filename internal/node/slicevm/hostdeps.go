package slicevm

// host_dependencies: the commands a provision needs, and, only when the
// agent's install setting is on, installing the pinned packages that
// provide the missing ones with the platform's package manager.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// DefaultInstallTimeout bounds a dependency install.
const DefaultInstallTimeout = 10 * time.Minute

// Package managers a dependency install uses.
const (
	PackageManagerAPT = "apt"
	PackageManagerDNF = "dnf"
)

// DependencyPackages is the pinned list: for each command a provision
// needs, the package that provides it, per package manager (Debian and
// Ubuntu for apt; Fedora for dnf, whose names RHEL-family hosts share
// except for QEMU, packaged there as qemu-kvm outside PATH).
var DependencyPackages = map[string]map[string]string{
	"qemu-system-x86_64":  {PackageManagerAPT: "qemu-system-x86", PackageManagerDNF: "qemu-system-x86-core"},
	"qemu-system-aarch64": {PackageManagerAPT: "qemu-system-arm", PackageManagerDNF: "qemu-system-aarch64-core"},
	"qemu-img":            {PackageManagerAPT: "qemu-utils", PackageManagerDNF: "qemu-img"},
	"ovs-vsctl":           {PackageManagerAPT: "openvswitch-switch", PackageManagerDNF: "openvswitch"},
}

// PackageManager picks the package manager from /etc/os-release's ID and
// ID_LIKE: apt on Debian and Ubuntu (and their derivatives), dnf on
// Fedora and the RHEL family; "" for anything else.
func PackageManager(osRelease []byte) string {
	var ids []string
	sc := bufio.NewScanner(bytes.NewReader(osRelease))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if ok && (k == "ID" || k == "ID_LIKE") {
			ids = append(ids, strings.Fields(strings.ToLower(strings.Trim(v, `"'`)))...)
		}
	}
	for _, id := range ids {
		switch id {
		case "debian", "ubuntu":
			return PackageManagerAPT
		case "fedora", "rhel", "centos", "rocky", "almalinux":
			return PackageManagerDNF
		}
	}
	return ""
}

// InstallCommand is one command of an install plan.
type InstallCommand struct {
	Args []string // Args[0] is the program
	Env  []string // added to the agent's environment
}

// InstallPlan returns the commands that install the packages providing
// missing with manager, and the packages. A command with no pinned
// package (or an unknown manager) is an error naming it.
func InstallPlan(manager string, missing []string) ([]InstallCommand, []string, error) {
	var pkgs, unknown []string
	for _, m := range missing {
		pkg := DependencyPackages[m][manager]
		if pkg == "" {
			unknown = append(unknown, m)
			continue
		}
		if !slices.Contains(pkgs, pkg) {
			pkgs = append(pkgs, pkg)
		}
	}
	if manager != PackageManagerAPT && manager != PackageManagerDNF {
		return nil, nil, fmt.Errorf("no supported package manager (apt on Debian/Ubuntu, dnf on Fedora/RHEL) per /etc/os-release")
	}
	if len(unknown) > 0 {
		return nil, nil, fmt.Errorf("no pinned package provides %s", strings.Join(unknown, ", "))
	}
	switch manager {
	case PackageManagerAPT:
		env := []string{"DEBIAN_FRONTEND=noninteractive"}
		return []InstallCommand{
			{Args: []string{"apt-get", "-q", "update"}, Env: env},
			{Args: append([]string{"apt-get", "-q", "-y", "--no-install-recommends", "install"}, pkgs...), Env: env},
		}, pkgs, nil
	default:
		return []InstallCommand{{Args: append([]string{"dnf", "-q", "-y", "install"}, pkgs...)}}, pkgs, nil
	}
}

// hostDependencies finds the commands the VM needs. A missing one is a
// blocker naming it, unless Options.InstallDependencies is set: then the
// pinned packages that provide them are installed (bounded by
// Options.InstallTimeout; each command's time is a timing,
// host_dependencies_install_<n>_ms, and a progress report) and the
// commands are looked up again.
func (pr *provision) hostDependencies(ctx context.Context) (step, error) {
	p := pr.p
	c, found, missing := p.lookDependencies(pr.params)
	pr.cmds = c
	if len(missing) == 0 {
		return done("%s", strings.Join(found, " ")), nil
	}
	if !p.opts.InstallDependencies {
		return step{}, missingDependency(missing, "install them on the host, or set the agent's install_dependencies setting")
	}
	osRelease, err := os.ReadFile(p.root("etc", "os-release"))
	if err != nil {
		return step{}, missingDependency(missing, "cannot install: "+err.Error())
	}
	cmds, pkgs, err := InstallPlan(PackageManager(osRelease), missing)
	if err != nil {
		return step{}, missingDependency(missing, "cannot install: "+err.Error())
	}
	timeout := p.opts.InstallTimeout
	if timeout <= 0 {
		timeout = DefaultInstallTimeout
	}
	ictx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for i, ic := range cmds {
		name := fmt.Sprintf("%s_install_%d", PhaseHostDependencies, i+1)
		start := p.opts.Now()
		cmd := exec.CommandContext(ictx, ic.Args[0], ic.Args[1:]...)
		cmd.Env = append(os.Environ(), ic.Env...)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		d := p.opts.Now().Sub(start)
		pr.t.timings[name+"_ms"] = d.Milliseconds()
		if pr.t.progress != nil {
			pr.t.progress(name, d, err)
		}
		p.opts.Log.Info("slicevm: host dependency install", "command", strings.Join(ic.Args, " "), "took", d, "err", err)
		if err != nil {
			if ictx.Err() != nil {
				err = fmt.Errorf("%w (install timeout %s)", ictx.Err(), timeout)
			}
			return step{}, missingDependency(missing, fmt.Sprintf("%s failed: %v: %s", strings.Join(ic.Args, " "), err, tail(out, 400)))
		}
	}
	c, found, still := p.lookDependencies(pr.params)
	pr.cmds = c
	if len(still) > 0 {
		return step{}, missingDependency(still, "still missing after installing "+strings.Join(pkgs, ", "))
	}
	return done("installed %s for %s; %s", strings.Join(pkgs, ", "), strings.Join(missing, ", "), strings.Join(found, " ")), nil
}

// tail is the last n bytes of b, trimmed.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
