package task

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

const testEd25519Key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl tenant@laptop"

func TestAllocProvisionUserParams(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	fe := func(field, msg string) []api.FieldError { return []api.FieldError{{Field: field, Message: msg}} }
	const userMsg = "must be a Linux user name: 1-32 characters of a-z 0-9 _ -, starting with a letter or _"
	const keyMsg = `must be an SSH public key in authorized_keys form, e.g. "ssh-ed25519 AAAA... user@host"`
	tooMany := make([]string, MaxAllocSSHKeys+1)
	for i := range tooMany {
		tooMany[i] = testEd25519Key
	}
	manyJSON, _ := json.Marshal(tooMany)
	tests := []struct {
		name   string
		params string
		want   AllocProvisionUserParams
		fe     []api.FieldError
	}{
		{"minimal", `{"allocation_id":"alloc-1","username":"alice"}`,
			AllocProvisionUserParams{AllocationID: "alloc-1", Username: "alice"}, nil},
		{"full", `{"allocation_id":"a1","username":"_bob-2","ssh_authorized_keys":["` + testEd25519Key + `"],"shell":"/usr/bin/zsh","sudo":true}`,
			AllocProvisionUserParams{AllocationID: "a1", Username: "_bob-2", SSHAuthorizedKeys: []string{testEd25519Key}, Shell: "/usr/bin/zsh", Sudo: true}, nil},
		{"in a slice vm", `{"allocation_id":"a1","username":"alice","vm_name":"slice-a1"}`,
			AllocProvisionUserParams{AllocationID: "a1", Username: "alice", VMName: "slice-a1"}, nil},
		{"vm name with a path", `{"allocation_id":"a1","username":"alice","vm_name":"../x"}`, AllocProvisionUserParams{},
			fe("params.vm_name", checkVMName("../x"))},
		{"32-char username", `{"allocation_id":"a1","username":"` + strings.Repeat("a", 32) + `"}`,
			AllocProvisionUserParams{AllocationID: "a1", Username: strings.Repeat("a", 32)}, nil},
		{"missing both", `{}`, AllocProvisionUserParams{},
			[]api.FieldError{{Field: "params.allocation_id", Message: "is required"}, {Field: "params.username", Message: "is required"}}},
		{"root", `{"allocation_id":"a1","username":"root"}`, AllocProvisionUserParams{}, fe("params.username", "must not be root")},
		{"33-char username", `{"allocation_id":"a1","username":"` + strings.Repeat("a", 33) + `"}`, AllocProvisionUserParams{}, fe("params.username", userMsg)},
		{"uppercase", `{"allocation_id":"a1","username":"Alice"}`, AllocProvisionUserParams{}, fe("params.username", userMsg)},
		{"leading dash", `{"allocation_id":"a1","username":"-alice"}`, AllocProvisionUserParams{}, fe("params.username", userMsg)},
		{"leading digit", `{"allocation_id":"a1","username":"1alice"}`, AllocProvisionUserParams{}, fe("params.username", userMsg)},
		{"bad allocation id", `{"allocation_id":"../x","username":"alice"}`, AllocProvisionUserParams{},
			fe("params.allocation_id", "must be 1-128 characters of A-Z a-z 0-9 . _ : -, starting with a letter or digit")},
		{"bad key", `{"allocation_id":"a1","username":"alice","ssh_authorized_keys":["` + testEd25519Key + `","ssh-rsa nope"]}`,
			AllocProvisionUserParams{}, fe("params.ssh_authorized_keys[1]", keyMsg)},
		{"two keys on one line", `{"allocation_id":"a1","username":"alice","ssh_authorized_keys":["` + testEd25519Key + `\n` + testEd25519Key + `"]}`,
			AllocProvisionUserParams{}, fe("params.ssh_authorized_keys[0]", "must be a single authorized_keys line")},
		{"too many keys", `{"allocation_id":"a1","username":"alice","ssh_authorized_keys":` + string(manyJSON) + `}`,
			AllocProvisionUserParams{}, fe("params.ssh_authorized_keys", fmt.Sprintf("at most %d keys", MaxAllocSSHKeys))},
		{"relative shell", `{"allocation_id":"a1","username":"alice","shell":"bash"}`, AllocProvisionUserParams{},
			fe("params.shell", `must be an absolute path of a login shell, e.g. "/bin/bash"`)},
		{"windows shell", `{"allocation_id":"a1","username":"alice","shell":"C:\\cmd.exe"}`, AllocProvisionUserParams{},
			fe("params.shell", `must be an absolute path of a login shell, e.g. "/bin/bash"`)},
		{"dotdot shell", `{"allocation_id":"a1","username":"alice","shell":"/bin/../tmp/sh"}`, AllocProvisionUserParams{},
			fe("params.shell", `must not contain ".." elements`)},
		{"sudo not bool", `{"allocation_id":"a1","username":"alice","sudo":"yes"}`, AllocProvisionUserParams{},
			fe("params.sudo", "must be a JSON boolean, not string")},
		{"unknown field", `{"allocation_id":"a1","username":"alice","password":"x"}`, AllocProvisionUserParams{},
			fe("params.password", "unknown parameter")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, gotFE := DecodeAllocProvisionUserParams(json.RawMessage(tc.params))
			if !reflect.DeepEqual(gotFE, tc.fe) || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decode = %+v, %+v; want %+v, %+v", got, gotFE, tc.want, tc.fe)
			}
			if rfe := r.Validate(TypeAllocProvisionUser, json.RawMessage(tc.params)); !reflect.DeepEqual(rfe, tc.fe) {
				t.Errorf("Registry.Validate = %+v, want %+v", rfe, tc.fe)
			}
		})
	}
	s, ok := r.Lookup(TypeAllocProvisionUser)
	if !ok || s.Timeout != AllocProvisionUserTimeout || AllocProvisionUserTimeout.Minutes() != 2 {
		t.Errorf("Lookup = %+v, %v", s, ok)
	}
}

func TestAllocDeprovisionUserParams(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	tests := []struct {
		name   string
		params string
		want   AllocDeprovisionUserParams
		fe     []api.FieldError
	}{
		{"default remove_home", `{"allocation_id":"a1","username":"alice"}`,
			AllocDeprovisionUserParams{AllocationID: "a1", Username: "alice", RemoveHome: &yes}, nil},
		{"keep home", `{"allocation_id":"a1","username":"alice","remove_home":false}`,
			AllocDeprovisionUserParams{AllocationID: "a1", Username: "alice", RemoveHome: &no}, nil},
		{"missing username", `{"allocation_id":"a1"}`, AllocDeprovisionUserParams{},
			[]api.FieldError{{Field: "params.username", Message: "is required"}}},
		{"root", `{"allocation_id":"a1","username":"root"}`, AllocDeprovisionUserParams{},
			[]api.FieldError{{Field: "params.username", Message: "must not be root"}}},
		{"unknown field", `{"allocation_id":"a1","username":"alice","force":true}`, AllocDeprovisionUserParams{},
			[]api.FieldError{{Field: "params.force", Message: "unknown parameter"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, gotFE := DecodeAllocDeprovisionUserParams(json.RawMessage(tc.params))
			if !reflect.DeepEqual(gotFE, tc.fe) || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decode = %+v, %+v; want %+v, %+v", got, gotFE, tc.want, tc.fe)
			}
			if rfe := r.Validate(TypeAllocDeprovisionUser, json.RawMessage(tc.params)); !reflect.DeepEqual(rfe, tc.fe) {
				t.Errorf("Registry.Validate = %+v, want %+v", rfe, tc.fe)
			}
		})
	}
	if s, ok := r.Lookup(TypeAllocDeprovisionUser); !ok || s.Timeout != AllocDeprovisionUserTimeout {
		t.Errorf("Lookup = %+v, %v", s, ok)
	}
}
