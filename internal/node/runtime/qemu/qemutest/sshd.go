package qemutest

// The guest's optional SSH server (Options.SSHD): the host's OpenSSH sshd
// and ssh-keygen with their shared libraries, the modules that read the
// cloud-init seed (a virtio-scsi CD-ROM with an ISO 9660 file system), and
// the boot step that sets up the seed's user with its authorized keys,
// generates a host key, reports it on ttyS0 as cloud-init does and starts
// sshd on port 22.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// KnobSSHD runs the SSH step before the marker. Build adds it when
// Options.SSHD is set.
const KnobSSHD = "drover.sshd=1"

// KnobDHCP, with KnobSSHD, gives eth0 its address by DHCP (busybox
// udhcpc; the lease's address, mask and router are applied, and
// DHCPBoundMarker + " <ip>" is printed on ttyS0) instead of 10.0.2.15.
const KnobDHCP = "drover.dhcp=1"

// DHCPBoundMarker starts the line the guest prints when eth0 leased an
// address (KnobDHCP).
const DHCPBoundMarker = "DROVER-GUEST-DHCP-BOUND"

// dhcpScript is udhcpc's script (/bin/dhcp-script): it applies a lease.
const dhcpScript = `#!/bin/sh
case "$1" in
deconfig) ifconfig "$interface" 0.0.0.0 up ;;
bound|renew)
	ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.0}" up
	[ -n "$router" ] && route add default gw "${router%% *}" dev "$interface" 2>/dev/null
	echo "` + DHCPBoundMarker + ` $ip" > /dev/ttyS0 ;;
esac
exit 0
`

// The block the guest prints its host key in on ttyS0 (cloud-init's
// keys_to_console format).
const (
	HostKeysBegin = "-----BEGIN SSH HOST KEY KEYS-----"
	HostKeysEnd   = "-----END SSH HOST KEY KEYS-----"
)

// Where the SSH programs live on the host, and in the guest.
const (
	sshdPath   = "/usr/sbin/sshd"
	keygenPath = "/usr/bin/ssh-keygen"
)

// sshdModules load, after netModules, in this order: the seed's CD-ROM
// on virtio-scsi and its file system.
var sshdModules = map[string]string{
	"scsi_common.ko": "drivers/scsi/scsi_common.ko",
	"scsi_mod.ko":    "drivers/scsi/scsi_mod.ko",
	"virtio_scsi.ko": "drivers/scsi/virtio_scsi.ko",
	"cdrom.ko":       "drivers/cdrom/cdrom.ko",
	"sr_mod.ko":      "drivers/scsi/sr_mod.ko",
	"isofs.ko":       "fs/isofs/isofs.ko",
}

var sshdModuleOrder = []string{"scsi_common.ko", "scsi_mod.ko", "virtio_scsi.ko", "cdrom.ko", "sr_mod.ko", "isofs.ko"}

// cpioFile is one extra file of the initramfs.
type cpioFile struct {
	name string // without the leading /
	perm uint32
	data []byte
}

// sshdFiles returns sshd, ssh-keygen and every shared library they load
// (ldd), at their host paths. missing is set when a program is absent.
func sshdFiles() (files []cpioFile, missing string, err error) {
	libs := map[string]bool{}
	for _, prog := range []string{sshdPath, keygenPath} {
		b, err := os.ReadFile(prog)
		if err != nil {
			return nil, prog + " not found (install openssh-server)", nil
		}
		files = append(files, cpioFile{strings.TrimPrefix(prog, "/"), 0o755, b})
		out, err := exec.Command("ldd", prog).Output()
		if err != nil {
			return nil, "", fmt.Errorf("ldd %s: %w", prog, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				libs[f[2]] = true
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				libs[f[0]] = true // the dynamic loader
			}
		}
	}
	paths := make([]string, 0, len(libs))
	for p := range libs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		b, err := os.ReadFile(p) // follows the soname link
		if err != nil {
			return nil, "", err
		}
		files = append(files, cpioFile{strings.TrimPrefix(p, "/"), 0o755, b})
	}
	return files, "", nil
}

// sshdModuleFiles finds sshdModules for the kernel in dir's tree.
func sshdModuleFiles(k kernel) (map[string]string, string) {
	out := map[string]string{}
	root := filepath.Dir(filepath.Dir(k.vmlinuz)) // .../boot/vmlinuz-V → ...
	for name, rel := range sshdModules {
		p := filepath.Join(root, "lib", "modules", k.version, "kernel", rel)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Sprintf("kernel module %s not found next to %s (needed by Options.SSHD)", rel, k.vmlinuz)
		}
		out[name] = p
	}
	return out, ""
}

// sshdFunc is the init script's start_sshd: the seed's first user, and
// root (the guest has no sudo; root logs in by key only), get the seed's
// ssh-* authorized keys (user-data is the JSON that
// internal/node/cloudinit writes), the host key is printed between
// HostKeysBegin and HostKeysEnd on ttyS0, and sshd listens on port 22 of
// 10.0.2.15 (with KnobDHCP, of the address eth0 leased).
func sshdFunc() string {
	return `start_sshd() {
	for m in ` + strings.Join(netModules, " ") + ` ` + strings.Join(sshdModuleOrder, " ") + `; do
		insmod /lib/modules/$m 2>/dev/null
	done
	ifconfig lo 127.0.0.1 up
	i=0
	if [ "$dhcp" = 1 ]; then
		while ! ifconfig eth0 up 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.05; i=$((i+1)); done
		busybox udhcpc -i eth0 -f -q -n -t 20 -T 3 -s /bin/dhcp-script 3<&- ||
			echo "drover-guest: no DHCP lease on eth0" > /dev/ttyS0
	else
		while ! ifconfig eth0 10.0.2.15 netmask 255.255.255.0 up 2>/dev/null && [ "$i" -lt 100 ]; do
			sleep 0.05; i=$((i+1))
		done
		route add default gw 10.0.2.2 2>/dev/null
	fi
	mkdir -p /mnt/seed
	i=0
	while [ ! -b /dev/sr0 ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i+1)); done
	user=drover
	keys=
	if mount -t iso9660 -o ro /dev/sr0 /mnt/seed 2>/dev/null && [ -f /mnt/seed/user-data ]; then
		u=$(grep -m1 '"name":' /mnt/seed/user-data | sed 's/.*"name": *"\([^"]*\)".*/\1/')
		[ -n "$u" ] && user="$u"
		keys=$(grep -o '"ssh-[^"]*"' /mnt/seed/user-data | tr -d '"')
	else
		echo "drover-guest: no cloud-init seed on /dev/sr0" > /dev/ttyS0
	fi
	mkdir -p /etc/ssh /run/sshd /root /dev/pts "/home/$user/.ssh"
	mount -t devpts -o mode=0620,ptmxmode=0666 devpts /dev/pts
	printf 'root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n%s:x:1000:1000::/home/%s:/bin/sh\n' "$user" "$user" > /etc/passwd
	printf 'root:x:0:\nnogroup:x:65534:\n%s:x:1000:\n' "$user" > /etc/group
	printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n' > /etc/nsswitch.conf
	printf '%s\n' "$keys" > "/home/$user/.ssh/authorized_keys"
	chmod 700 "/home/$user/.ssh"
	chmod 600 "/home/$user/.ssh/authorized_keys"
	chown -R 1000:1000 "/home/$user"
	mkdir -p /root/.ssh
	printf '%s\n' "$keys" > /root/.ssh/authorized_keys
	chmod 700 /root/.ssh
	chmod 600 /root/.ssh/authorized_keys
	` + keygenPath + ` -q -t ed25519 -N '' -C "root@guest" -f /etc/ssh/ssh_host_ed25519_key
	{ echo "` + HostKeysBegin + `"; cat /etc/ssh/ssh_host_ed25519_key.pub; echo "` + HostKeysEnd + `"; } > /dev/ttyS0
	printf '%s\n' 'HostKey /etc/ssh/ssh_host_ed25519_key' 'UsePAM no' 'PasswordAuthentication no' \
		'KbdInteractiveAuthentication no' 'PermitRootLogin prohibit-password' 'StrictModes no' 'UseDNS no' 'PrintMotd no' \
		'PrintLastLog no' 'PidFile /run/sshd.pid' > /etc/ssh/sshd_config
	` + sshdPath + ` -f /etc/ssh/sshd_config -E /tmp/sshd.log 3<&- ||
		echo "drover-guest: sshd failed: $(cat /tmp/sshd.log)" > /dev/ttyS0
}
`
}
