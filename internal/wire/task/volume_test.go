package task

import (
	"encoding/json"
	"testing"
)

func TestVolumeTasks(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		typ, params, field string
	}{
		{TypeVolumeList, `{}`, ""},
		{TypeVolumeList, `{"name":"x"}`, "params.name"},
		{TypeVolumeDelete, `{"name":"pgdata"}`, ""},
		{TypeVolumeDelete, `{"name":"cache.v2"}`, ""},
		{TypeVolumeDelete, `{}`, "params.name"},
		{TypeVolumeDelete, `{"name":"../etc"}`, "params.name"},
		{TypeVolumeDelete, `{"name":"a..b"}`, "params.name"},
		{TypeVolumeDelete, `{"name":"a/b"}`, "params.name"},
		{TypeVolumeDelete, `{"name":"Data"}`, "params.name"},
		{TypeVolumeDelete, `{"name":"x","force":true}`, "params.force"},
	} {
		fe := r.Validate(tc.typ, json.RawMessage(tc.params))
		switch {
		case tc.field == "" && len(fe) != 0:
			t.Errorf("%s %s: %+v", tc.typ, tc.params, fe)
		case tc.field != "" && (len(fe) == 0 || fe[0].Field != tc.field):
			t.Errorf("%s %s: %+v, want an error on %s", tc.typ, tc.params, fe, tc.field)
		}
	}
	if p, fe := DecodeVolumeDeleteParams(json.RawMessage(`{"name":"pgdata"}`)); fe != nil || p.Name != "pgdata" {
		t.Errorf("decode: %+v %+v", p, fe)
	}
}
