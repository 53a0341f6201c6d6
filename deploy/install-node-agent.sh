#!/bin/sh
# install-node-agent.sh: install the Drover node agent (drover-agent) as a
# service on Linux (systemd) or DragonFlyBSD (rc.d). POSIX sh; idempotent:
# run it again to upgrade the binary and the service file. It never
# overwrites an existing env file, and it never enables or starts the
# service: it prints what to do next. docs/install.md walks through it.
#
# Usage: install-node-agent.sh --from-dir DIR [--prefix DIR] [--root DIR]
#        install-node-agent.sh --uninstall [--purge] [--prefix DIR] [--root DIR]
set -eu

prog=install-node-agent.sh
here=$(cd "$(dirname "$0")" && pwd)

usage() {
	cat <<EOF
Usage: $prog --from-dir DIR [--prefix DIR] [--root DIR]
       $prog --uninstall [--purge] [--prefix DIR] [--root DIR]

Installs drover-agent from DIR into PREFIX/bin, creates the state directory
(/var/lib/drover-agent, mode 0700) and the env file from a commented
template (never overwriting one that exists), and installs the service:
a systemd unit on Linux, an rc.d script on DragonFlyBSD. It does not enable
or start the service; it prints the next steps.

  --from-dir DIR  take drover-agent from DIR (a release archive or a build
                  output directory); nothing is downloaded
  --prefix DIR    installation prefix (default /usr/local)
  --root DIR      stage everything under DIR instead of / (like DESTDIR);
                  paths inside the installed files stay as if at /
  --uninstall     remove the binary and the service file; the state
                  directory and the env file are kept
  --purge         with --uninstall: also remove the state directory and the
                  env file (the host's identity and bootstrap token)
  --help          print this and do nothing

The binary must match this host: a mismatch is reported as
node_agent_binary_invalid with the expected and the found architecture.
EOF
}

say() { printf '%s\n' "$*"; }
die() {
	printf '%s: %s\n' "$prog" "$*" >&2
	exit 1
}

prefix=/usr/local
root=
from_dir=
uninstall=0
purge=0
while [ $# -gt 0 ]; do
	case $1 in
	--help | -h)
		usage
		exit 0
		;;
	--prefix | --root | --from-dir)
		[ $# -ge 2 ] || die "$1 needs a value"
		case $1 in
		--prefix) prefix=$2 ;;
		--root) root=$2 ;;
		--from-dir) from_dir=$2 ;;
		esac
		shift 2
		;;
	--prefix=*) prefix=${1#*=} && shift ;;
	--root=*) root=${1#*=} && shift ;;
	--from-dir=*) from_dir=${1#*=} && shift ;;
	--uninstall) uninstall=1 && shift ;;
	--purge) purge=1 && shift ;;
	*)
		usage >&2
		die "unknown argument: $1"
		;;
	esac
done
case $prefix in
/*) ;;
*) die "--prefix $prefix: must be an absolute path" ;;
esac
prefix=${prefix%/}
[ "$purge" = 0 ] || [ "$uninstall" = 1 ] || die "--purge goes with --uninstall"
if [ -n "$root" ]; then
	mkdir -p "$root" || die "--root $root: cannot create it"
	root=$(cd "$root" && pwd)
	[ "$root" != / ] || root=
fi

# The host: DROVER_INSTALL_UNAME_S and DROVER_INSTALL_UNAME_M stand in for
# uname -s and uname -m (tests stage the other platform's layout).
os=${DROVER_INSTALL_UNAME_S:-$(uname -s)}
machine=${DROVER_INSTALL_UNAME_M:-$(uname -m)}
case $os in
Linux) platform=linux ;;
DragonFly) platform=dragonfly ;;
*) die "unsupported system $os: this installer knows Linux and DragonFly (Windows: drover-agent service install)" ;;
esac
case $machine in
x86_64 | amd64) host_arch=amd64 ;;
aarch64 | arm64) host_arch=arm64 ;;
*) die "unsupported machine $machine: drover-agent is built for amd64 and arm64" ;;
esac

# Where things go (paths as seen on the installed system).
bin=$prefix/bin/drover-agent
state_dir=/var/lib/drover-agent
if [ "$platform" = linux ]; then
	env_dir=/etc/drover-agent
	service_src=$here/systemd/drover-agent.service
	service_dst=/etc/systemd/system/drover-agent.service
else
	env_dir=$prefix/etc/drover-agent
	service_src=$here/rc.d/drover_agent
	service_dst=$prefix/etc/rc.d/drover_agent
fi
env_file=$env_dir/env

# systemd_running: systemd manages this (unstaged) system.
systemd_running() {
	[ -z "$root" ] && [ "$platform" = linux ] && [ -d /run/systemd/system ] &&
		command -v systemctl >/dev/null 2>&1
}

# elf_arch FILE: the architecture of an ELF executable (amd64, arm64, ...),
# from its header: class, byte order and e_machine. Prints "not an ELF
# executable" for anything else.
elf_arch() {
	# Bytes 0-19: magic (4), class, data, version, OSABI, padding, e_type (2), e_machine (2).
	# shellcheck disable=SC2046 # word splitting of od's numbers is intended
	set -- $(od -An -tu1 -N20 "$1" 2>/dev/null)
	if [ $# -lt 20 ] || [ "$1 $2 $3 $4" != "127 69 76 70" ]; then
		say "not an ELF executable"
		return
	fi
	class=$5 data=$6 osabi=$8
	if [ "$data" = 1 ]; then machine_id=$((${19} + ${20} * 256)); else machine_id=$((${19} * 256 + ${20})); fi
	case "$class/$machine_id" in
	2/62) arch=amd64 ;;
	2/183) arch=arm64 ;;
	1/3) arch=386 ;;
	1/40) arch=arm ;;
	2/243) arch=riscv64 ;;
	2/21) arch=ppc64 ;;
	2/22) arch=s390x ;;
	*) arch="unknown (ELF class $class, e_machine $machine_id)" ;;
	esac
	# OSABI 3 is Linux (GNU); 0 (System V) is what Go writes for Linux and
	# DragonFly alike.
	case $osabi in
	0) say "$arch" ;;
	3) say "linux/$arch" ;;
	9) say "freebsd/$arch" ;;
	*) say "$arch (ELF OSABI $osabi)" ;;
	esac
}

# check_binary FILE: the binary is an executable for this host, and it runs.
check_binary() {
	found=$(elf_arch "$1")
	expected=$host_arch
	case $found in
	"$host_arch") ;;
	"linux/$host_arch") [ "$platform" = linux ] || { expected=dragonfly/$host_arch; false; } ;;
	*) false ;;
	esac || die "node_agent_binary_invalid: expected $expected, found $found ($1)"
	if ! out=$("$1" -version 2>&1); then
		die "node_agent_binary_invalid: expected $platform/$host_arch, found a binary that does not run here ($1 -version: $out)"
	fi
	say "checked $1: $(printf '%s\n' "$out" | head -n 1), runs on $platform/$host_arch"
}

# put SRC DST MODE: install a file atomically (a running agent keeps its
# old binary until it restarts).
put() {
	mkdir -p "$(dirname "$2")"
	cp "$1" "$2.new.$$"
	chmod "$3" "$2.new.$$"
	mv -f "$2.new.$$" "$2"
}

do_install() {
	if [ -z "$from_dir" ]; then
		die "no binary given. This installer downloads nothing: get drover-agent for $platform/$host_arch (a release archive, or 'go build ./cmd/drover-agent' in a Drover checkout), then run: $0 --from-dir DIR (DIR holds drover-agent)"
	fi
	src=$from_dir/drover-agent
	[ -f "$src" ] || die "--from-dir $from_dir: no drover-agent in it"
	[ -f "$service_src" ] || die "service file $service_src is missing: run the installer from a Drover checkout or release archive"
	[ -f "$here/drover-agent.env" ] || die "env template $here/drover-agent.env is missing"
	check_binary "$src"

	put "$src" "$root$bin" 0755
	say "installed $bin"

	mkdir -p "$root$state_dir"
	chmod 0700 "$root$state_dir"
	say "state directory $state_dir (mode 0700)"

	mkdir -p "$root$env_dir"
	chmod 0755 "$root$env_dir"
	if [ -e "$root$env_file" ]; then
		say "kept the existing env file $env_file"
	else
		(umask 077 && sed "s|/etc/drover-agent/env|$env_file|" "$here/drover-agent.env" >"$root$env_file.new.$$")
		mv "$root$env_file.new.$$" "$root$env_file"
		say "wrote the env file $env_file (mode 0600) from the template"
	fi
	chmod 0600 "$root$env_file"

	# The service file names the binary and the env file at their default
	# places; other prefixes are substituted.
	mkdir -p "$(dirname "$root$service_dst")"
	sed -e "s|/usr/local/bin/drover-agent|$bin|g" -e "s|/usr/local/etc/drover-agent/env|$env_file|g" \
		"$service_src" >"$root$service_dst.new.$$"
	if [ "$platform" = linux ]; then
		chmod 0644 "$root$service_dst.new.$$"
	else
		chmod 0755 "$root$service_dst.new.$$"
	fi
	mv -f "$root$service_dst.new.$$" "$root$service_dst"
	say "installed the service file $service_dst"
	if systemd_running; then
		systemctl daemon-reload
		say "ran systemctl daemon-reload"
	fi

	say ""
	say "Next steps:"
	say "  1. On the control plane: drover hosts create <host-id>  (prints the bootstrap token, the CA hash and the node URL)"
	say "  2. Put them in $env_file: NODE_AGENT_HOST_ID, NODE_AGENT_BOOTSTRAP_TOKEN, NODE_AGENT_CA_HASH, NODE_AGENT_CONTROL_PLANE_URL"
	if [ "$platform" = linux ]; then
		if [ -n "$root" ] || [ -d /run/systemd/system ]; then
			say "  3. systemctl enable --now drover-agent; then: systemctl status drover-agent, journalctl -u drover-agent"
		else
			say "  3. systemd is not running here: run $bin under your service manager with the variables of $env_file"
		fi
	else
		say "  3. sysrc drover_agent_enable=YES && service drover_agent start  (NODE_AGENT_QEMU_ACCEL=nvmm needs NVMM: nvmmctl identify)"
	fi
	say "  Check it: drover-agent status; on the control plane: drover hosts show <host-id>"
}

do_uninstall() {
	if systemd_running && systemctl is-active --quiet drover-agent 2>/dev/null; then
		systemctl disable --now drover-agent
		say "stopped and disabled drover-agent"
	fi
	if [ "$platform" = dragonfly ] && [ -z "$root" ] && [ -f /var/run/drover_agent.pid ] && [ -x "$service_dst" ]; then
		"$service_dst" onestop || true
	fi
	for f in "$bin" "$service_dst"; do
		if [ -e "$root$f" ]; then
			rm -f "$root$f"
			say "removed $f"
		fi
	done
	if systemd_running; then
		systemctl daemon-reload
	fi
	if [ "$purge" = 1 ]; then
		rm -rf "$root$state_dir" "$root$env_dir"
		say "purged $state_dir and $env_dir (the host's identity and token are gone: enrol it again with a new bootstrap token)"
	else
		say "kept $state_dir and $env_file (--purge removes them)"
	fi
}

if [ "$uninstall" = 1 ]; then
	do_uninstall
else
	do_install
fi
