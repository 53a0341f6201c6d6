package task

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

func noParams(p json.RawMessage) []api.FieldError {
	var v struct{}
	return DecodeParams(p, &v)
}

// builtinTypesAnd is the sorted list of the built-in task types and extra,
// written out from Builtin() so that a new task type needs no edit here.
func builtinTypesAnd(extra ...string) []string {
	types := extra
	for _, s := range Builtin() {
		types = append(types, s.Type)
	}
	sort.Strings(types)
	return types
}

func TestNewRegistry(t *testing.T) {
	tests := []struct {
		name  string
		specs []Spec
		ok    bool
	}{
		{"builtin", Builtin(), true},
		{"empty registry", nil, true},
		{"two types", []Spec{{Type: "b", Validate: noParams, Timeout: time.Second, Meaning: "m"}, {Type: "a", Validate: noParams, Timeout: time.Second, Meaning: "m"}}, true},
		{"duplicate", []Spec{{Type: "a", Validate: noParams, Timeout: time.Second, Meaning: "m"}, {Type: "a", Validate: noParams, Timeout: time.Second, Meaning: "m"}}, false},
		{"duplicate builtin", append(Builtin(), Builtin()...), false},
		{"empty type", []Spec{{Validate: noParams, Timeout: time.Second, Meaning: "m"}}, false},
		{"nil validate", []Spec{{Type: "a", Timeout: time.Second}}, false},
		{"zero timeout", []Spec{{Type: "a", Validate: noParams, Meaning: "m"}}, false},
		{"no meaning", []Spec{{Type: "a", Validate: noParams, Timeout: time.Second}}, false},
	}
	for _, tc := range tests {
		r, err := NewRegistry(tc.specs...)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v", tc.name, err)
		}
		if err == nil && len(r.Types()) != len(tc.specs) {
			t.Errorf("%s: types = %v", tc.name, r.Types())
		}
	}
}

func TestRegistryLookupAndTypes(t *testing.T) {
	r, err := NewRegistry(append(Builtin(), Spec{Type: "a.first", Validate: noParams, Timeout: time.Minute, Meaning: "m"})...)
	if err != nil {
		t.Fatal(err)
	}
	types := r.Types()
	if strings.Join(types, ",") != strings.Join(builtinTypesAnd("a.first"), ",") {
		t.Fatalf("Types = %v", types)
	}
	types[0] = "mutated"
	if r.Types()[0] != "a.first" {
		t.Fatal("Types returned internal slice")
	}
	s, ok := r.Lookup(TypeHealthProbe)
	if !ok || s.Timeout != 30*time.Second || s.Lease() != time.Minute {
		t.Fatalf("Lookup = %+v, %v (lease %s)", s, ok, s.Lease())
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Fatal("Lookup(nope) succeeded")
	}
}

func TestRegistryValidate(t *testing.T) {
	r, err := NewRegistry(append(Builtin(), Spec{Type: "a.first", Validate: noParams, Timeout: time.Minute, Meaning: "m"})...)
	if err != nil {
		t.Fatal(err)
	}
	fe := func(field, msg string) []api.FieldError { return []api.FieldError{{Field: field, Message: msg}} }
	absMsg := `must be an absolute path (e.g. "/var/lib/x" or "C:\data\x")`
	registered := strings.Join(builtinTypesAnd("a.first"), ", ")
	tests := []struct {
		name   string
		typ    string
		params string
		want   []api.FieldError // nil → valid; Message "" → any message
	}{
		{"absent params", TypeHealthProbe, "", nil},
		{"null params", TypeHealthProbe, "null", nil},
		{"empty object", TypeHealthProbe, "{}", nil},
		{"whitespace", TypeHealthProbe, " \n{ } ", nil},
		{"empty path", TypeHealthProbe, `{"diagnostic_path":""}`, nil},
		{"posix path", TypeHealthProbe, `{"diagnostic_path":"/var/lib/drover/diag"}`, nil},
		{"windows drive path", TypeHealthProbe, `{"diagnostic_path":"C:\\ProgramData\\drover"}`, nil},
		{"windows forward slashes", TypeHealthProbe, `{"diagnostic_path":"d:/drover"}`, nil},
		{"unc path", TypeHealthProbe, `{"diagnostic_path":"\\\\srv\\share\\x"}`, nil},
		{"relative path", TypeHealthProbe, `{"diagnostic_path":"var/lib"}`, fe("params.diagnostic_path", absMsg)},
		{"drive-relative path", TypeHealthProbe, `{"diagnostic_path":"C:drover"}`, fe("params.diagnostic_path", absMsg)},
		{"dotdot", TypeHealthProbe, `{"diagnostic_path":"/var/../etc/shadow"}`, fe("params.diagnostic_path", `must not contain ".." elements`)},
		{"dotdot windows", TypeHealthProbe, `{"diagnostic_path":"C:\\x\\..\\y"}`, fe("params.diagnostic_path", `must not contain ".." elements`)},
		{"dots in names ok", TypeHealthProbe, `{"diagnostic_path":"/var/..x/.y"}`, nil},
		{"nul byte", TypeHealthProbe, `{"diagnostic_path":"/var/x\u0000y"}`, fe("params.diagnostic_path", "must not contain control characters")},
		{"too long", TypeHealthProbe, `{"diagnostic_path":"/` + strings.Repeat("a", MaxPathLen) + `"}`, fe("params.diagnostic_path", "must be at most 4096 bytes")},
		{"unknown field", TypeHealthProbe, `{"diagnostic_path":"/x","extra":1}`, fe("params.extra", "unknown parameter")},
		{"wrong type", TypeHealthProbe, `{"diagnostic_path":5}`, fe("params.diagnostic_path", "must be a JSON string, not number")},
		{"array params", TypeHealthProbe, `[]`, fe("params", "params must be a JSON object")},
		{"string params", TypeHealthProbe, `"x"`, fe("params", "params must be a JSON object")},
		{"number params", TypeHealthProbe, `1`, fe("params", "params must be a JSON object")},
		{"trailing data", TypeHealthProbe, `{}{}`, fe("params", "params must be a JSON object")},
		{"invalid json", TypeHealthProbe, `{`, fe("params", "params must be a JSON object")},
		{"no-params type with params", "a.first", `{"x":1}`, fe("params.x", "unknown parameter")},
		{"no-params type without params", "a.first", ``, nil},
		{"unknown type", "x", `{}`, fe("type", `unknown task type "x"; registered: `+registered)},
		{"empty type", "", `{}`, fe("type", "type is required; registered: "+registered)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := r.Validate(tc.typ, json.RawMessage(tc.params))
			if len(got) != len(tc.want) {
				t.Fatalf("Validate = %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("Validate[%d] = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestBuiltinFresh(t *testing.T) {
	a := Builtin()
	a[0].Type = "mutated"
	if Builtin()[0].Type != TypeHealthProbe {
		t.Fatal("Builtin shares state between calls")
	}
}

// FuzzRegistryValidate: never panics; accepted params are a JSON object that
// decodes strictly into HealthProbeParams with an acceptable path.
func FuzzRegistryValidate(f *testing.F) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range []string{"", "null", "{}", `{"diagnostic_path":"/x"}`, `{"diagnostic_path":"C:\\x"}`,
		`{"diagnostic_path":"/a/../b"}`, `{"x":1}`, `[]`, `{"diagnostic_path":null}`} {
		f.Add(TypeHealthProbe, p)
	}
	f.Add("nope", "{}")
	f.Fuzz(func(t *testing.T, typ, params string) {
		fe := r.Validate(typ, json.RawMessage(params))
		for _, e := range fe {
			if e.Field == "" || e.Message == "" {
				t.Fatalf("empty field error %+v", e)
			}
		}
		if len(fe) > 0 || typ == TypeTopologyDiscover { // see TestTopologyDiscoverParams
			return
		}
		if typ != TypeHealthProbe {
			t.Fatalf("accepted type %q", typ)
		}
		obj, nfe := NormalizeParams(json.RawMessage(params))
		if nfe != nil || obj[0] != '{' {
			t.Fatalf("accepted non-object params %q", params)
		}
		var p HealthProbeParams
		if err := json.Unmarshal(obj, &p); err != nil {
			t.Fatalf("accepted params that do not decode: %v", err)
		}
		if p.DiagnosticPath != "" && (checkAbsPath(p.DiagnosticPath) != "" || !isAbsAnyOS(p.DiagnosticPath) ||
			strings.ContainsRune(p.DiagnosticPath, 0)) {
			t.Fatalf("accepted path %q", p.DiagnosticPath)
		}
	})
}
