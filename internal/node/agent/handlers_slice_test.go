package agent

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/drover-dev/drover/internal/node/slice"
)

func TestSliceHandlers(t *testing.T) {
	h, ok := SliceHandlers(Config{HostID: "node-s"})["slice.topology_discover"]
	if !ok || h.Timeout <= 0 {
		t.Fatalf("handler = %+v, %v", h, ok)
	}
	tests := []struct {
		name     string
		params   string
		wantCode string
	}{
		{"defaults", ``, ""},
		{"explicit", `{"ovs_bridge":"br-gpu","private_cidr":"10.78.0.0/24"}`, ""},
		{"unknown param", `{"bridge":"x"}`, "invalid_params"},
		{"bad cidr", `{"private_cidr":"8.8.8.0/24"}`, "invalid_params"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := h.Run(context.Background(), Task{Type: slice.TaskType, Params: json.RawMessage(tc.params)})
			if tc.wantCode != "" {
				var he *HandlerError
				if !errors.As(err, &he) || he.Code != tc.wantCode {
					t.Fatalf("err = %v, want code %s", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			topo, ok := out.Output.(slice.Topology)
			if !ok || !topo.ApprovalRequired || topo.HostID != "node-s" {
				t.Fatalf("output = %#v", out.Output)
			}
			if _, ok := out.Timings[slice.PhaseSlots+"_ms"]; !ok {
				t.Errorf("timings = %v", out.Timings)
			}
		})
	}
}
