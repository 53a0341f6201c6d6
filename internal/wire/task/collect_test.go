package task

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestDecodeCollectParams(t *testing.T) {
	tests := []struct {
		params string
		want   CollectParams
		fe     string
	}{
		{`{}`, CollectParams{MaxBytes: DefaultCollectBytes}, ""},
		{`{"max_bytes":1024,"correlation_id":"c1"}`, CollectParams{MaxBytes: 1024, CorrelationID: "c1"}, ""},
		{`{"max_bytes":786433}`, CollectParams{}, "params.max_bytes"},
		{`{"max_bytes":-1}`, CollectParams{}, "params.max_bytes"},
		{`{"correlation_id":"x"}`, CollectParams{MaxBytes: DefaultCollectBytes, CorrelationID: "x"}, ""},
		{`{"path":"/etc/shadow"}`, CollectParams{}, "params.path"},
	}
	for _, tc := range tests {
		got, fe := DecodeCollectParams(json.RawMessage(tc.params))
		var field string
		if len(fe) > 0 {
			field = fe[0].Field
		}
		if field != tc.fe || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %+v %v; want %+v %s", tc.params, got, fe, tc.want, tc.fe)
		}
	}
}
