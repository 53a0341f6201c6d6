package task

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/api"
)

func TestEchoParams(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := r.Lookup(TypeEcho)
	if !ok || s.Timeout != EchoTimeout || s.Internal {
		t.Fatalf("Lookup = %+v, %v", s, ok)
	}
	fe := func(field, msg string) []api.FieldError { return []api.FieldError{{Field: field, Message: msg}} }
	tests := []struct {
		name   string
		params string
		want   EchoParams
		fe     []api.FieldError
	}{
		{"absent", "", EchoParams{}, nil},
		{"empty message", `{"message":""}`, EchoParams{}, nil},
		{"message", `{"message":"hello"}`, EchoParams{Message: "hello"}, nil},
		{"1 KiB", `{"message":"` + strings.Repeat("x", MaxEchoMessage) + `"}`, EchoParams{Message: strings.Repeat("x", MaxEchoMessage)}, nil},
		{"over 1 KiB", `{"message":"` + strings.Repeat("x", MaxEchoMessage+1) + `"}`, EchoParams{}, fe("params.message", "must be at most 1024 bytes")},
		{"1 KiB counts bytes", `{"message":"` + strings.Repeat("é", MaxEchoMessage/2+1) + `"}`, EchoParams{}, fe("params.message", "must be at most 1024 bytes")},
		{"not a string", `{"message":1}`, EchoParams{}, fe("params.message", "must be a JSON string, not number")},
		{"unknown field", `{"msg":"x"}`, EchoParams{}, fe("params.msg", "unknown parameter")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, gotFE := DecodeEchoParams(json.RawMessage(tc.params))
			if !reflect.DeepEqual(gotFE, tc.fe) || got != tc.want {
				t.Errorf("Decode = %+v, %+v; want %+v, %+v", got, gotFE, tc.want, tc.fe)
			}
			if rfe := r.Validate(TypeEcho, json.RawMessage(tc.params)); !reflect.DeepEqual(rfe, tc.fe) {
				t.Errorf("Registry.Validate = %+v, want %+v", rfe, tc.fe)
			}
		})
	}
}
