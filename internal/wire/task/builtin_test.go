package task

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

func TestTopologyDiscoverParams(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	fe := func(field, msg string) []api.FieldError { return []api.FieldError{{Field: field, Message: msg}} }
	const ifMsg = "must be a network interface name: 1-15 characters of A-Z a-z 0-9 . _ -, not starting with -"
	const cidrMsg = `must be an IPv4 CIDR, e.g. "10.77.0.0/24"`
	def := TopologyDiscoverParams{OVSBridge: "br-slice", PrivateCIDR: "10.77.0.0/24"}
	tests := []struct {
		name   string
		params string
		want   TopologyDiscoverParams
		fe     []api.FieldError
	}{
		{"absent", "", def, nil},
		{"null", "null", def, nil},
		{"empty object", "{}", def, nil},
		{"empty strings take defaults", `{"ovs_bridge":"","private_cidr":""}`, def, nil},
		{"both set", `{"ovs_bridge":"br-gpu0","private_cidr":"192.168.40.0/24"}`,
			TopologyDiscoverParams{OVSBridge: "br-gpu0", PrivateCIDR: "192.168.40.0/24"}, nil},
		{"15-char bridge, /16 in 172.16/12", `{"ovs_bridge":"abcdefghijklmno","private_cidr":"172.20.0.0/16"}`,
			TopologyDiscoverParams{OVSBridge: "abcdefghijklmno", PrivateCIDR: "172.20.0.0/16"}, nil},
		{"bridge too long", `{"ovs_bridge":"abcdefghijklmnop"}`, TopologyDiscoverParams{}, fe("params.ovs_bridge", ifMsg)},
		{"bridge with slash", `{"ovs_bridge":"br/0"}`, TopologyDiscoverParams{}, fe("params.ovs_bridge", ifMsg)},
		{"bridge with space", `{"ovs_bridge":"br 0"}`, TopologyDiscoverParams{}, fe("params.ovs_bridge", ifMsg)},
		{"bridge dotdot", `{"ovs_bridge":".."}`, TopologyDiscoverParams{}, fe("params.ovs_bridge", ifMsg)},
		{"bridge leading dash", `{"ovs_bridge":"-br"}`, TopologyDiscoverParams{}, fe("params.ovs_bridge", ifMsg)},
		{"bridge not a string", `{"ovs_bridge":5}`, TopologyDiscoverParams{}, fe("params.ovs_bridge", "must be a JSON string, not number")},
		{"cidr garbage", `{"private_cidr":"ten"}`, TopologyDiscoverParams{}, fe("params.private_cidr", cidrMsg)},
		{"cidr without length", `{"private_cidr":"10.77.0.0"}`, TopologyDiscoverParams{}, fe("params.private_cidr", cidrMsg)},
		{"cidr ipv6", `{"private_cidr":"fd00::/64"}`, TopologyDiscoverParams{}, fe("params.private_cidr", cidrMsg)},
		{"cidr not network address", `{"private_cidr":"10.77.0.5/24"}`, TopologyDiscoverParams{},
			fe("params.private_cidr", "must be a network address (10.77.0.0/24)")},
		{"cidr too small", `{"private_cidr":"10.77.0.0/29"}`, TopologyDiscoverParams{},
			fe("params.private_cidr", "prefix length must be between /16 and /28")},
		{"cidr too large", `{"private_cidr":"10.0.0.0/8"}`, TopologyDiscoverParams{},
			fe("params.private_cidr", "prefix length must be between /16 and /28")},
		{"cidr public", `{"private_cidr":"8.8.8.0/24"}`, TopologyDiscoverParams{},
			fe("params.private_cidr", "must be a private (RFC 1918) range: 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16")},
		{"both bad", `{"ovs_bridge":"a b","private_cidr":"x"}`, TopologyDiscoverParams{},
			[]api.FieldError{{Field: "params.ovs_bridge", Message: ifMsg}, {Field: "params.private_cidr", Message: cidrMsg}}},
		{"unknown field", `{"bridge":"br0"}`, TopologyDiscoverParams{}, fe("params.bridge", "unknown parameter")},
		{"array", `[]`, TopologyDiscoverParams{}, fe("params", "params must be a JSON object")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, gotFE := DecodeTopologyDiscoverParams(json.RawMessage(tc.params))
			if !reflect.DeepEqual(gotFE, tc.fe) || got != tc.want {
				t.Errorf("Decode = %+v, %+v; want %+v, %+v", got, gotFE, tc.want, tc.fe)
			}
			if rfe := r.Validate(TypeTopologyDiscover, json.RawMessage(tc.params)); !reflect.DeepEqual(rfe, tc.fe) {
				t.Errorf("Registry.Validate = %+v, want %+v", rfe, tc.fe)
			}
		})
	}
	s, ok := r.Lookup(TypeTopologyDiscover)
	if !ok || s.Timeout != TopologyDiscoverTimeout {
		t.Errorf("Lookup = %+v, %v", s, ok)
	}
}
