package firecracker

// A validator of requests against Firecracker's API specification
// (testdata/firecracker-api-v1.16.1.yaml: Swagger 2.0, copied from
// ../shared/specs/firecracker-api-v1.16.1.yaml, the API definition of
// Firecracker v1.16.1, src/firecracker/swagger/firecracker.yaml upstream).
// It covers the subset of Swagger the spec uses: paths with {params},
// methods, one body parameter per operation, $ref to definitions, object
// (required, properties, additionalProperties), array (items), string,
// integer, number, boolean, enum, minimum and maximum. Unknown properties
// are refused unless additionalProperties allows them: Firecracker's
// request types are serde structs with deny_unknown_fields, so a property
// the spec does not list is a 400 there too.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/drover-dev/drover/internal/node/runtime"
)

const specPath = "testdata/firecracker-api-v1.16.1.yaml"

type apiSpec struct {
	Swagger     string                          `yaml:"swagger"`
	Paths       map[string]map[string]operation `yaml:"paths"`
	Definitions map[string]*schema              `yaml:"definitions"`
}

type operation struct {
	OperationID string      `yaml:"operationId"`
	Parameters  []parameter `yaml:"parameters"`
}

type parameter struct {
	Name     string  `yaml:"name"`
	In       string  `yaml:"in"`
	Required bool    `yaml:"required"`
	Type     string  `yaml:"type"`
	Schema   *schema `yaml:"schema"`
}

type schema struct {
	Ref                  string             `yaml:"$ref"`
	Type                 string             `yaml:"type"`
	Required             []string           `yaml:"required"`
	Properties           map[string]*schema `yaml:"properties"`
	AdditionalProperties any                `yaml:"additionalProperties"`
	Items                *schema            `yaml:"items"`
	Enum                 []any              `yaml:"enum"`
	Minimum              *float64           `yaml:"minimum"`
	Maximum              *float64           `yaml:"maximum"`
}

func loadSpec(path string) (*apiSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s apiSpec
	if err := yaml.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if s.Swagger != "2.0" || len(s.Paths) == 0 {
		return nil, fmt.Errorf("%s: not a Swagger 2.0 spec with paths", path)
	}
	return &s, nil
}

// requestError is a request the spec does not allow; Status is what the
// contract server answers (404 unknown path, 405 method, 400 body).
type requestError struct {
	Status int
	Msg    string
}

func (e *requestError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Msg) }

// route finds the path template matching path and its operation for method.
func (s *apiSpec) route(method, path string) (string, operation, error) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	templates := make([]string, 0, len(s.Paths))
	for t := range s.Paths {
		templates = append(templates, t)
	}
	sort.Strings(templates) // literal segments sort before "{"
	for _, t := range templates {
		tsegs := strings.Split(strings.Trim(t, "/"), "/")
		if len(tsegs) != len(segs) {
			continue
		}
		ok := true
		for i := range tsegs {
			isParam := strings.HasPrefix(tsegs[i], "{")
			if (isParam && segs[i] == "") || (!isParam && tsegs[i] != segs[i]) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		op, found := s.Paths[t][strings.ToLower(method)]
		if !found {
			return t, operation{}, &requestError{http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: method not in the spec for %s", method, path, t)}
		}
		return t, op, nil
	}
	return "", operation{}, &requestError{http.StatusNotFound, fmt.Sprintf("%s %s: path not in the spec", method, path)}
}

// validateRequest checks one request against the spec.
func (s *apiSpec) validateRequest(method, path string, body []byte) error {
	t, op, err := s.route(method, path)
	if err != nil {
		return err
	}
	var bodyParam *parameter
	for i := range op.Parameters {
		if op.Parameters[i].In == "body" {
			bodyParam = &op.Parameters[i]
		}
	}
	body = bytes.TrimSpace(body)
	if bodyParam == nil {
		if len(body) > 0 {
			return &requestError{http.StatusBadRequest, fmt.Sprintf("%s %s: the spec takes no body", method, t)}
		}
		return nil
	}
	if len(body) == 0 {
		if bodyParam.Required {
			return &requestError{http.StatusBadRequest, fmt.Sprintf("%s %s: body %q is required", method, t, bodyParam.Name)}
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return &requestError{http.StatusBadRequest, fmt.Sprintf("%s %s: body is not JSON: %v", method, t, err)}
	}
	if err := s.validate(bodyParam.Schema, v, "body"); err != nil {
		return &requestError{http.StatusBadRequest, fmt.Sprintf("%s %s: %v", method, t, err)}
	}
	return nil
}

func (s *apiSpec) resolve(sc *schema) (*schema, error) {
	for depth := 0; sc != nil && sc.Ref != ""; depth++ {
		name, ok := strings.CutPrefix(sc.Ref, "#/definitions/")
		if !ok || depth > 16 {
			return nil, fmt.Errorf("unsupported $ref %q", sc.Ref)
		}
		if sc = s.Definitions[name]; sc == nil {
			return nil, fmt.Errorf("$ref %q: no such definition", name)
		}
	}
	return sc, nil
}

// validate checks v (decoded with UseNumber) against sc; at names the value.
func (s *apiSpec) validate(sc *schema, v any, at string) error {
	sc, err := s.resolve(sc)
	if err != nil || sc == nil {
		return err
	}
	typ := sc.Type
	if typ == "" && sc.Properties != nil {
		typ = "object"
	}
	switch typ {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %s", at, jsonType(v))
		}
		for _, r := range sc.Required {
			if _, ok := obj[r]; !ok {
				return fmt.Errorf("%s: required property %q is missing", at, r)
			}
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ps, known := sc.Properties[k]
			if !known {
				switch ap := sc.AdditionalProperties.(type) {
				case bool:
					if ap {
						continue
					}
				case map[string]any:
					continue // a schema for extra properties: not used by this spec's requests
				}
				return fmt.Errorf("%s: unknown property %q (the spec lists %v)", at, k, sortedKeys(sc.Properties))
			}
			if err := s.validate(ps, obj[k], at+"."+k); err != nil {
				return err
			}
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want an array, got %s", at, jsonType(v))
		}
		for i, x := range arr {
			if err := s.validate(sc.Items, x, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case "string":
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%s: want a string, got %s", at, jsonType(v))
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: want a boolean, got %s", at, jsonType(v))
		}
	case "integer", "number":
		n, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: want %s, got %s", at, typ, jsonType(v))
		}
		if typ == "integer" {
			if _, err := n.Int64(); err != nil {
				return fmt.Errorf("%s: want an integer, got %s", at, n)
			}
		}
		f, _ := n.Float64()
		if sc.Minimum != nil && f < *sc.Minimum {
			return fmt.Errorf("%s: %s is below the minimum %v", at, n, *sc.Minimum)
		}
		if sc.Maximum != nil && f > *sc.Maximum {
			return fmt.Errorf("%s: %s is above the maximum %v", at, n, *sc.Maximum)
		}
	case "":
	default:
		return fmt.Errorf("%s: schema type %q is not supported by this validator", at, typ)
	}
	if len(sc.Enum) > 0 {
		got := fmt.Sprint(v)
		if !slices.ContainsFunc(sc.Enum, func(e any) bool { return fmt.Sprint(e) == got }) {
			return fmt.Errorf("%s: %q is not one of %v", at, got, sc.Enum)
		}
	}
	return nil
}

func sortedKeys(m map[string]*schema) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}

// TestValidatorCatches is the proof that the contract test can fail: every
// kind of request the spec forbids is refused, with the right status.
func TestValidatorCatches(t *testing.T) {
	s, err := loadSpec(specPath)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		{"unknown path", "PUT", "/machine-configs", `{}`, 404, "path not in the spec"},
		{"method", "DELETE", "/drives/rootfs", ``, 405, "method not in the spec"},
		{"get with no such method", "POST", "/", ``, 405, "method"},
		{"missing required body", "PUT", "/boot-source", ``, 400, "required"},
		{"missing required property", "PUT", "/machine-config", `{"vcpu_count":1}`, 400, `"mem_size_mib" is missing`},
		{"wrong type", "PUT", "/machine-config", `{"vcpu_count":"2","mem_size_mib":128}`, 400, "want integer, got a string"},
		{"not an integer", "PUT", "/machine-config", `{"vcpu_count":1.5,"mem_size_mib":128}`, 400, "want an integer"},
		{"below minimum", "PUT", "/machine-config", `{"vcpu_count":0,"mem_size_mib":128}`, 400, "minimum"},
		{"above maximum", "PUT", "/machine-config", `{"vcpu_count":33,"mem_size_mib":128}`, 400, "maximum"},
		{"unknown property (typo)", "PUT", "/boot-source", `{"kernel_image_path":"/k","boot_arg":"x"}`, 400, `unknown property "boot_arg"`},
		{"enum", "PUT", "/actions", `{"action_type":"InstanceStop"}`, 400, "not one of"},
		{"boolean", "PUT", "/drives/rootfs", `{"drive_id":"rootfs","is_root_device":"true"}`, 400, "want a boolean"},
		{"array items", "PUT", "/mmds/config", `{"network_interfaces":[1]}`, 400, "want a string"},
		{"nested ref", "PUT", "/drives/rootfs", `{"drive_id":"r","is_root_device":true,"rate_limiter":{"ops":{"size":-1,"refill_time":1}}}`, 400, "minimum"},
		{"vsock cid", "PUT", "/vsock", `{"guest_cid":2,"uds_path":"/v.sock"}`, 400, "minimum"},
		{"not json", "PUT", "/vsock", `{guest_cid`, 400, "not JSON"},
		{"body where none is taken", "GET", "/", `{"x":1}`, 400, "no body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := s.validateRequest(tc.method, tc.path, []byte(tc.body))
			re, ok := err.(*requestError)
			if !ok {
				t.Fatalf("validateRequest = %v, want a *requestError %d", err, tc.status)
			}
			if re.Status != tc.status || !strings.Contains(re.Msg, tc.want) {
				t.Errorf("validateRequest = %v, want %d containing %q", re, tc.status, tc.want)
			}
		})
	}
	ok := []struct{ method, path, body string }{
		{"GET", "/", ``},
		{"GET", "/machine-config", ``},
		{"PUT", "/mmds", `{"anything":{"goes":[1,2]}}`},
		{"PUT", "/drives/rootfs", `{"drive_id":"rootfs","is_root_device":true,"is_read_only":false,"path_on_host":"/r","cache_type":"Unsafe","io_engine":"Sync"}`},
		{"PUT", "/actions", `{"action_type":"SendCtrlAltDel"}`},
	}
	for _, c := range ok {
		if err := s.validateRequest(c.method, c.path, []byte(c.body)); err != nil {
			t.Errorf("%s %s %s: %v, want valid", c.method, c.path, c.body, err)
		}
	}
}

// TestClientBodiesMatchSpec: every request type of the client, filled with
// every field it has, is valid against the definition it is written for,
// so no field name drifts from the spec.
func TestClientBodiesMatchSpec(t *testing.T) {
	s, err := loadSpec(specPath)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		method, path string
		body         any
	}{
		{"PUT", "/machine-config", MachineConfiguration{VCPUCount: 2, MemSizeMiB: 256, SMT: true}},
		{"PUT", "/boot-source", BootSource{KernelImagePath: "/k", BootArgs: "console=ttyS0", InitrdPath: "/i"}},
		{"PUT", "/drives/d", Drive{DriveID: "d", IsRootDevice: true, IsReadOnly: true, PathOnHost: "/r", CacheType: "Writeback", IOEngine: "Async"}},
		{"PUT", "/network-interfaces/eth0", NetworkInterface{IfaceID: "eth0", HostDevName: "tap0", GuestMAC: "02:00:00:00:00:01"}},
		{"PUT", "/vsock", Vsock{GuestCID: 3, UDSPath: "/v.sock"}},
		{"PUT", "/mmds/config", MMDSConfig{Version: "V2", NetworkInterfaces: []string{"eth0"}, IPv4Address: "169.254.169.254"}},
		{"PUT", "/mmds", metadata(runtime.Spec{ID: "x", Owner: "o"}, persisted{GuestIP: "10.0.0.2"})},
		{"PUT", "/actions", InstanceActionInfo{ActionType: ActionInstanceStart}},
	}
	for _, c := range cases {
		b, _ := json.Marshal(c.body)
		if err := s.validateRequest(c.method, c.path, b); err != nil {
			t.Errorf("%s %s %s: %v", c.method, c.path, b, err)
		}
	}
}
