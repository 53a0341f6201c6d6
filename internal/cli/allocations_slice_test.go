package cli

import (
	"bytes"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TestSliceFlags: allocations create's readiness flags parse into the
// request's readiness_marker and readiness_timeout_seconds.
func TestSliceFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    api.SliceRequest
		wantErr bool
	}{
		{"none", nil, api.SliceRequest{Slots: 1}, false},
		{"marker and timeout", []string{"--readiness-marker", "GUEST UP", "--readiness-timeout", "4m"},
			api.SliceRequest{Slots: 1, ReadinessMarker: "GUEST UP", ReadinessTimeoutSeconds: 240}, false},
		{"seconds", []string{"--readiness-timeout", "90s"}, api.SliceRequest{Slots: 1, ReadinessTimeoutSeconds: 90}, false},
		{"fraction of a second", []string{"--readiness-timeout", "1500ms"}, api.SliceRequest{}, true},
		{"negative", []string{"--readiness-timeout=-1m"}, api.SliceRequest{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var root CLI
			parser, err := newParser(&root, &Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}})
			if err != nil {
				t.Fatal(err)
			}
			args := append([]string{"allocations", "create", "--user", "alice", "--slots", "1"}, tc.args...)
			if _, err := parser.Parse(args); err != nil {
				t.Fatal(err)
			}
			got, err := root.Allocations.Create.SliceFlags.request()
			if (err != nil) != tc.wantErr {
				t.Fatalf("request: %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && (got.ReadinessMarker != tc.want.ReadinessMarker ||
				got.ReadinessTimeoutSeconds != tc.want.ReadinessTimeoutSeconds || got.Slots != 1) {
				t.Fatalf("request %+v, want %+v", got, tc.want)
			}
		})
	}
}
