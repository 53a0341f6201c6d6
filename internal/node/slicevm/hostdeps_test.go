package slicevm

import (
	"slices"
	"strings"
	"testing"
)

func TestPackageManager(t *testing.T) {
	tests := []struct{ name, osRelease, want string }{
		{"debian", "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n", PackageManagerAPT},
		{"ubuntu", "NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\n", PackageManagerAPT},
		{"mint via ID_LIKE", "ID=linuxmint\nID_LIKE=\"ubuntu debian\"\n", PackageManagerAPT},
		{"fedora", "NAME=\"Fedora Linux\"\nID=fedora\n", PackageManagerDNF},
		{"rhel", "ID=\"rhel\"\nID_LIKE=\"fedora\"\n", PackageManagerDNF},
		{"rocky", "ID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\n", PackageManagerDNF},
		{"alpine", "ID=alpine\n", ""},
		{"empty", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := PackageManager([]byte(tc.osRelease)); got != tc.want {
				t.Errorf("PackageManager = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestInstallPlan(t *testing.T) {
	tests := []struct {
		name     string
		manager  string
		missing  []string
		want     []string // each command joined by spaces
		wantPkgs []string
		wantEnv  string
		err      string
	}{
		{"apt qemu", PackageManagerAPT, []string{"qemu-system-x86_64", "qemu-img"},
			[]string{"apt-get -q update", "apt-get -q -y --no-install-recommends install qemu-system-x86 qemu-utils"},
			[]string{"qemu-system-x86", "qemu-utils"}, "DEBIAN_FRONTEND=noninteractive", ""},
		{"apt ovs", PackageManagerAPT, []string{"ovs-vsctl"},
			[]string{"apt-get -q update", "apt-get -q -y --no-install-recommends install openvswitch-switch"},
			[]string{"openvswitch-switch"}, "DEBIAN_FRONTEND=noninteractive", ""},
		{"dnf all", PackageManagerDNF, []string{"qemu-system-aarch64", "qemu-img", "ovs-vsctl"},
			[]string{"dnf -q -y install qemu-system-aarch64-core qemu-img openvswitch"},
			[]string{"qemu-system-aarch64-core", "qemu-img", "openvswitch"}, "", ""},
		{"a configured qemu-img path has no package", PackageManagerAPT, []string{"/opt/qemu/bin/qemu-img"}, nil, nil, "",
			"no pinned package provides /opt/qemu/bin/qemu-img"},
		{"no package manager", "", []string{"qemu-img"}, nil, nil, "", "no supported package manager"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmds, pkgs, err := InstallPlan(tc.manager, tc.missing)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range cmds {
				got = append(got, strings.Join(c.Args, " "))
				if tc.wantEnv != "" && !slices.Contains(c.Env, tc.wantEnv) {
					t.Errorf("%v: env %v lacks %s", c.Args, c.Env, tc.wantEnv)
				}
			}
			if !slices.Equal(got, tc.want) || !slices.Equal(pkgs, tc.wantPkgs) {
				t.Errorf("plan %q packages %v, want %q %v", got, pkgs, tc.want, tc.wantPkgs)
			}
		})
	}
}
