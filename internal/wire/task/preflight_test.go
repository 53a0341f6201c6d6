package task

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestDecodePreflightParams(t *testing.T) {
	tests := []struct {
		params string
		want   PreflightParams
		fe     string
	}{
		{``, PreflightParams{HopTimeoutSeconds: DefaultPreflightHopTimeout}, ""},
		{`{}`, PreflightParams{HopTimeoutSeconds: DefaultPreflightHopTimeout}, ""},
		{`{"hop_timeout_seconds":3}`, PreflightParams{HopTimeoutSeconds: 3}, ""},
		{`{"hop_timeout_seconds":20}`, PreflightParams{HopTimeoutSeconds: 20}, ""},
		{`{"hop_timeout_seconds":21}`, PreflightParams{}, "params.hop_timeout_seconds"},
		{`{"hop_timeout_seconds":-1}`, PreflightParams{}, "params.hop_timeout_seconds"},
		{`{"hop_timeout_seconds":"5"}`, PreflightParams{}, "params.hop_timeout_seconds"},
		{`{"runtime_api_url":"https://evil"}`, PreflightParams{}, "params.runtime_api_url"},
	}
	for _, tc := range tests {
		got, fe := DecodePreflightParams(json.RawMessage(tc.params))
		var field string
		if len(fe) > 0 {
			field = fe[0].Field
		}
		if field != tc.fe || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %+v %v; want %+v %s", tc.params, got, fe, tc.want, tc.fe)
		}
	}
}

// TestPreflightRegistered: diag.preflight is a built-in operators may
// enqueue, and the registry validates its params.
func TestPreflightRegistered(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := r.Lookup(TypePreflight)
	if !ok || s.Internal || s.Timeout != PreflightTimeout {
		t.Fatalf("spec %+v ok=%v", s, ok)
	}
	if fe := s.Validate(json.RawMessage(`{"hop_timeout_seconds":99}`)); len(fe) != 1 {
		t.Errorf("validate: %v", fe)
	}
}
