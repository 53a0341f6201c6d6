package task

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Bare-metal allocation task types (the bare-metal task family): the OS
// user a tenant gets on a whole host (internal/node/osuser runs them).
const (
	// TypeAllocProvisionUser creates (or updates) an allocation's OS user,
	// applies its SSH keys and verifies the result.
	TypeAllocProvisionUser = "allocation.provision_user"
	// AllocProvisionUserTimeout bounds allocation.provision_user on the agent.
	AllocProvisionUserTimeout = 2 * time.Minute
	// TypeAllocDeprovisionUser removes an allocation's OS user and its access.
	TypeAllocDeprovisionUser = "allocation.deprovision_user"
	// AllocDeprovisionUserTimeout bounds allocation.deprovision_user.
	AllocDeprovisionUserTimeout = 2 * time.Minute

	// MaxAllocSSHKeys bounds ssh_authorized_keys.
	MaxAllocSSHKeys = 64
)

// AllocProvisionUserParams are the params of allocation.provision_user.
// The server checks what it can without the node; the node also checks the
// shell against its /etc/shells and the username against its accounts.
type AllocProvisionUserParams struct {
	AllocationID string `json:"allocation_id"`
	// Username is a Linux user name, not root.
	Username          string   `json:"username"`
	SSHAuthorizedKeys []string `json:"ssh_authorized_keys,omitempty"`
	// Shell is an absolute path; "" means /bin/bash when the node has it,
	// else /bin/sh.
	Shell string `json:"shell,omitempty"`
	// Sudo grants passwordless sudo (a file in /etc/sudoers.d).
	Sudo bool `json:"sudo,omitempty"`
	// VMName, when set, provisions the user inside that slice VM, over
	// the node's brokered SSH channel into the guest, instead of on the
	// host's OS; the node refuses a VM it did not provision for
	// AllocationID.
	VMName string `json:"vm_name,omitempty"`
}

// AllocDeprovisionUserParams are the params of allocation.deprovision_user.
type AllocDeprovisionUserParams struct {
	AllocationID string `json:"allocation_id"`
	Username     string `json:"username"`
	// RemoveHome removes the home directory too; nil means true
	// (WithDefaults sets it).
	RemoveHome *bool `json:"remove_home,omitempty"`
	// VMName, when set, removes the user's access inside that slice VM
	// (as AllocProvisionUserParams.VMName); a VM already released has
	// nothing left to remove.
	VMName string `json:"vm_name,omitempty"`
}

// WithDefaults returns p with RemoveHome set (true when not given).
func (p AllocDeprovisionUserParams) WithDefaults() AllocDeprovisionUserParams {
	if p.RemoveHome == nil {
		t := true
		p.RemoveHome = &t
	}
	return p
}

// DecodeAllocProvisionUserParams strictly decodes and validates the params
// of allocation.provision_user; the server and the agent both use it.
func DecodeAllocProvisionUserParams(params json.RawMessage) (AllocProvisionUserParams, []api.FieldError) {
	var p AllocProvisionUserParams
	if fe := DecodeParams(params, &p); fe != nil {
		return AllocProvisionUserParams{}, fe
	}
	var v fieldErrs
	v.check("allocation_id", checkRequired(p.AllocationID, checkToken))
	v.check("username", checkRequired(p.Username, checkUsername))
	if len(p.SSHAuthorizedKeys) > MaxAllocSSHKeys {
		v.add("ssh_authorized_keys", fmt.Sprintf("at most %d keys", MaxAllocSSHKeys))
	} else {
		for i, k := range p.SSHAuthorizedKeys {
			v.check(fmt.Sprintf("ssh_authorized_keys[%d]", i), checkSSHKey(k))
		}
	}
	if p.Shell != "" {
		v.check("shell", checkShellPath(p.Shell))
	}
	if p.VMName != "" {
		v.check("vm_name", checkVMName(p.VMName))
	}
	if v.fe != nil {
		return AllocProvisionUserParams{}, v.fe
	}
	return p, nil
}

// DecodeAllocDeprovisionUserParams strictly decodes and validates the
// params of allocation.deprovision_user. The result has defaults applied.
func DecodeAllocDeprovisionUserParams(params json.RawMessage) (AllocDeprovisionUserParams, []api.FieldError) {
	var p AllocDeprovisionUserParams
	if fe := DecodeParams(params, &p); fe != nil {
		return AllocDeprovisionUserParams{}, fe
	}
	var v fieldErrs
	v.check("allocation_id", checkRequired(p.AllocationID, checkToken))
	v.check("username", checkRequired(p.Username, checkUsername))
	if p.VMName != "" {
		v.check("vm_name", checkVMName(p.VMName))
	}
	if v.fe != nil {
		return AllocDeprovisionUserParams{}, v.fe
	}
	return p.WithDefaults(), nil
}

// checkShellPath accepts a POSIX absolute path of printable characters
// without "..", at most 256 bytes (whether the node lists it in
// /etc/shells is the node's check).
func checkShellPath(s string) string {
	const msg = `must be an absolute path of a login shell, e.g. "/bin/bash"`
	if len(s) > 256 || s[0] != '/' || hasControl(s) {
		return msg
	}
	if m := checkAbsPath(s); m != "" {
		return m
	}
	return ""
}

func validateAllocProvisionUser(params json.RawMessage) []api.FieldError {
	_, fe := DecodeAllocProvisionUserParams(params)
	return fe
}

func validateAllocDeprovisionUser(params json.RawMessage) []api.FieldError {
	_, fe := DecodeAllocDeprovisionUserParams(params)
	return fe
}
