package guestssh

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// UserMarkerDir is where, in the guest, ProvisionUser records a user it
// created (one file per user holding the allocation id): DeprovisionUser
// deletes only such users, and a retried provision knows the account is
// its own.
const UserMarkerDir = "/var/lib/drover/users"

// UserRequest is the allocation's user to provision in a guest.
type UserRequest struct {
	AllocationID string
	Username     string
	// SSHAuthorizedKeys replace the allocation's block in the user's
	// authorized_keys (lines outside the block, such as the terminal key
	// of the VM's default user, are kept).
	SSHAuthorizedKeys []string
	// Shell is an absolute path; "" means /bin/bash when the guest has
	// it, else /bin/sh.
	Shell string
	// Sudo grants passwordless sudo (/etc/sudoers.d/drover-<user>).
	Sudo bool
}

// UserResult is what the guest reported after provisioning.
type UserResult struct {
	Username string `json:"username"`
	UID      int    `json:"uid"`
	Home     string `json:"home"`
	Shell    string `json:"shell"`
	// Created: this call created the account; false: it existed and was
	// brought up to date.
	Created bool `json:"created"`
	// Keys is the number of the allocation's keys in authorized_keys.
	Keys int  `json:"keys"`
	Sudo bool `json:"sudo"`
}

// ProvisionUser creates (or updates) req's user in the guest through a,
// idempotently: an existing account keeps its uid and home and gets the
// allocation's keys and sudo setting. Accounts below uid 1000 (root,
// system users) are refused. On failure the guest is rolled back: an
// account this call created is deleted with its home, and an existing
// account's authorized_keys and sudoers file are restored.
func ProvisionUser(ctx context.Context, a *Conn, req UserRequest) (UserResult, error) {
	out, err := a.Run(ctx, provisionScript(req))
	if err != nil {
		return UserResult{}, fmt.Errorf("provision user %s in the guest: %w", req.Username, err)
	}
	return parseUserResult(out)
}

// DeprovisionUser removes the allocation's keys and sudoers file from the
// user and deletes the account (with its home when removeHome) when
// ProvisionUser created it for this allocation; an account it did not
// create (the VM's default user) keeps existing. removed reports the
// account was deleted.
func DeprovisionUser(ctx context.Context, a *Conn, allocationID, username string, removeHome bool) (removed bool, err error) {
	out, err := a.Run(ctx, deprovisionScript(allocationID, username, removeHome))
	if err != nil {
		return false, fmt.Errorf("deprovision user %s in the guest: %w", username, err)
	}
	return strings.Contains(string(out), "removed=1"), nil
}

// shq quotes s for sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func blockMarks(alloc string) (begin, end string) {
	return "# drover allocation " + alloc + " begin", "# drover allocation " + alloc + " end"
}

// userFuncs are the shell functions both scripts use: deleting an account
// with whatever tools the guest has (userdel, deluser, or editing the
// account files on a guest with neither), and dropping the allocation's
// block from an authorized_keys file.
const userFuncs = `
delete_user() {
	if command -v userdel >/dev/null 2>&1; then userdel "$u" || return 1
	elif command -v deluser >/dev/null 2>&1; then deluser "$u" || return 1
	else
		for f in /etc/passwd /etc/group /etc/shadow /etc/gshadow; do
			if [ -f "$f" ]; then sed -i "/^$u:/d" "$f" || return 1; fi
		done
	fi
	rm -f "/etc/sudoers.d/drover-$u" "` + UserMarkerDir + `/$u"
}
strip_block() {
	if [ -f "$1" ]; then awk -v b="$begin" -v e="$end" '$0==b{s=1;next} $0==e{s=0;next} !s' "$1"; fi
}
`

func provisionScript(req UserRequest) string {
	begin, end := blockMarks(req.AllocationID)
	sudo := "0"
	if req.Sudo {
		sudo = "1"
	}
	var s strings.Builder
	fmt.Fprintf(&s, "set -u\nset -f\nu=%s\nalloc=%s\nshell=%s\nsudo=%s\nbegin=%s\nend=%s\nkeys=%s\n",
		shq(req.Username), shq(req.AllocationID), shq(req.Shell), sudo, shq(begin), shq(end),
		shq(strings.Join(req.SSHAuthorizedKeys, "\n")))
	s.WriteString(userFuncs)
	s.WriteString(`
created=0 backup= hadsudo=0 ak=
rollback() {
	if [ "$created" = 1 ]; then
		home=$(awk -F: -v u="$u" '$1==u{print $6}' /etc/passwd)
		delete_user
		if [ -n "$home" ] && [ "$home" != / ]; then rm -rf "$home"; fi
	else
		if [ -n "$backup" ] && [ -f "$backup" ]; then cp -p "$backup" "$ak"; fi
		if [ "$hadsudo" = 0 ]; then rm -f "/etc/sudoers.d/drover-$u"; fi
	fi
	if [ -n "$backup" ]; then rm -f "$backup"; fi
}
fail() { echo "drover-user: $*" >&2; rollback; exit 1; }
if [ -z "$shell" ]; then
	if [ -x /bin/bash ]; then shell=/bin/bash; else shell=/bin/sh; fi
fi
[ -x "$shell" ] || fail "shell $shell does not exist in the guest"
[ "$sudo" = 0 ] || command -v sudo >/dev/null 2>&1 || fail "sudo requested but the guest has no sudo"
if [ -f "/etc/sudoers.d/drover-$u" ]; then hadsudo=1; fi
line=$(awk -F: -v u="$u" '$1==u' /etc/passwd)
if [ -n "$line" ]; then
	uid=$(echo "$line" | cut -d: -f3)
	[ "$uid" -ge 1000 ] || { echo "drover-user: $u is a system account (uid $uid)" >&2; exit 1; }
else
	mkdir -p /home
	if command -v useradd >/dev/null 2>&1; then
		useradd -m -s "$shell" -c "drover allocation $alloc" "$u" >&2 || { echo "drover-user: useradd $u failed" >&2; exit 1; }
		created=1
	elif command -v adduser >/dev/null 2>&1; then
		adduser -D -s "$shell" -g "drover allocation $alloc" "$u" >&2 || { echo "drover-user: adduser $u failed" >&2; exit 1; }
		created=1
	else
		# No account tools (a minimal guest): the next free id from 1000.
		uid=$(awk -F: '$3>=1000 && $3<60000 && $3>m {m=$3} END {print (m ? m+1 : 1000)}' /etc/passwd /etc/group)
		echo "$u:x:$uid:$uid:drover allocation $alloc:/home/$u:$shell" >> /etc/passwd || { echo "drover-user: cannot write /etc/passwd" >&2; exit 1; }
		created=1
		echo "$u:x:$uid:" >> /etc/group || fail "cannot write /etc/group"
		if [ -f /etc/shadow ]; then echo "$u:!:1::::::" >> /etc/shadow || fail "cannot write /etc/shadow"; fi
		mkdir -p "/home/$u" && chown "$uid:$uid" "/home/$u" && chmod 750 "/home/$u" || fail "create /home/$u"
	fi
	mkdir -p ` + UserMarkerDir + ` && echo "$alloc" > "` + UserMarkerDir + `/$u" || fail "write the creation marker"
fi
uid=$(id -u "$u") && gid=$(id -g "$u") || fail "id $u"
home=$(awk -F: -v u="$u" '$1==u{print $6}' /etc/passwd)
[ -n "$home" ] && [ -d "$home" ] || fail "home of $u missing"
cur=$(awk -F: -v u="$u" '$1==u{print $7}' /etc/passwd)
if [ "$cur" != "$shell" ]; then
	if command -v usermod >/dev/null 2>&1; then usermod -s "$shell" "$u" || fail "usermod -s"
	else awk -F: -v OFS=: -v u="$u" -v s="$shell" '$1==u{$7=s} {print}' /etc/passwd > /etc/passwd.drover &&
		cat /etc/passwd.drover > /etc/passwd && rm -f /etc/passwd.drover || fail "set the shell of $u"; fi
fi
ak="$home/.ssh/authorized_keys"
mkdir -p "$home/.ssh" || fail "mkdir $home/.ssh"
if [ -f "$ak" ]; then backup=$(mktemp) && cp -p "$ak" "$backup" || fail "back up $ak"; fi
tmp="$home/.ssh/.authorized_keys.drover"
{
	strip_block "$ak"
	echo "$begin"
	if [ -n "$keys" ]; then printf '%s\n' "$keys"; fi
	echo "$end"
} > "$tmp" || fail "write $tmp"
chown "$uid:$gid" "$home/.ssh" "$tmp" && chmod 700 "$home/.ssh" && chmod 600 "$tmp" && mv -f "$tmp" "$ak" || fail "install $ak"
if [ "$sudo" = 1 ]; then
	mkdir -p /etc/sudoers.d && echo "$u ALL=(ALL) NOPASSWD:ALL" > "/etc/sudoers.d/drover-$u" &&
		chmod 440 "/etc/sudoers.d/drover-$u" || fail "write sudoers"
else
	rm -f "/etc/sudoers.d/drover-$u"
fi
# Verify: the account, its home and every key.
id "$u" >/dev/null 2>&1 || fail "$u missing after provisioning"
n=0
old=$IFS
IFS='
'
for k in $keys; do
	grep -qxF "$k" "$ak" || fail "key missing from $ak"
	n=$((n+1))
done
IFS=$old
if [ -n "$backup" ]; then rm -f "$backup"; fi
s=0
if [ -f "/etc/sudoers.d/drover-$u" ]; then s=1; fi
echo "username=$u"; echo "uid=$uid"; echo "home=$home"; echo "shell=$shell"
echo "created=$created"; echo "keys=$n"; echo "sudo=$s"
`)
	return s.String()
}

func deprovisionScript(alloc, username string, removeHome bool) string {
	begin, end := blockMarks(alloc)
	rh := "0"
	if removeHome {
		rh = "1"
	}
	var s strings.Builder
	fmt.Fprintf(&s, "set -u\nu=%s\nalloc=%s\nbegin=%s\nend=%s\nrh=%s\n", shq(username), shq(alloc), shq(begin), shq(end), rh)
	s.WriteString(userFuncs)
	s.WriteString(`
line=$(awk -F: -v u="$u" '$1==u' /etc/passwd)
if [ -z "$line" ]; then echo "removed=0"; exit 0; fi
home=$(echo "$line" | cut -d: -f6)
ak="$home/.ssh/authorized_keys"
if [ -f "$ak" ]; then
	strip_block "$ak" > "$ak.drover" && cat "$ak.drover" > "$ak" && rm -f "$ak.drover" || { echo "drover-user: edit $ak" >&2; exit 1; }
fi
rm -f "/etc/sudoers.d/drover-$u"
if [ -f "` + UserMarkerDir + `/$u" ] && [ "$(cat "` + UserMarkerDir + `/$u")" = "$alloc" ]; then
	if command -v pkill >/dev/null 2>&1; then pkill -KILL -u "$u" 2>/dev/null; fi
	delete_user || { echo "drover-user: delete $u" >&2; exit 1; }
	if [ "$rh" = 1 ] && [ -n "$home" ] && [ "$home" != / ]; then rm -rf "$home"; fi
	echo "removed=1"
else
	echo "removed=0"
fi
`)
	return s.String()
}

// parseUserResult reads the key=value lines provisionScript prints.
func parseUserResult(out []byte) (UserResult, error) {
	kv := keyValues(out)
	var r UserResult
	var err error
	if r.UID, err = strconv.Atoi(kv["uid"]); err != nil {
		return r, fmt.Errorf("guest reported no uid: %q", out)
	}
	r.Keys, _ = strconv.Atoi(kv["keys"])
	r.Username, r.Home, r.Shell = kv["username"], kv["home"], kv["shell"]
	r.Created, r.Sudo = kv["created"] == "1", kv["sudo"] == "1"
	return r, nil
}
