package task

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeImagePullParams(t *testing.T) {
	dg := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		params string
		want   ImagePullParams
		fe     string
	}{
		{`{"ref":"busybox"}`, ImagePullParams{Ref: "busybox", TimeoutSeconds: 600}, ""},
		{`{"ref":"127.0.0.1:5000/drover/app:v1","digest":"` + dg + `","registry_auth":"reg-cred","timeout_seconds":1800}`,
			ImagePullParams{Ref: "127.0.0.1:5000/drover/app:v1", Digest: dg, RegistryAuth: "reg-cred", TimeoutSeconds: 1800}, ""},
		{`{"ref":"vllm/vllm-openai:v0.6.3_post1"}`, ImagePullParams{Ref: "vllm/vllm-openai:v0.6.3_post1", TimeoutSeconds: 600}, ""},
		{``, ImagePullParams{}, "params.ref"},
		{`{"ref":""}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"https://registry.example/app:v1"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"app:v1 --rm"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"app\n"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"app@` + dg + `"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"-app"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"reg//app"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"app:"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"` + strings.Repeat("a", 256) + `"}`, ImagePullParams{}, "params.ref"},
		{`{"ref":"app","digest":"sha256:abc"}`, ImagePullParams{}, "params.digest"},
		{`{"ref":"app","digest":"` + strings.ToUpper(dg) + `"}`, ImagePullParams{}, "params.digest"},
		{`{"ref":"app","digest":"md5:` + strings.Repeat("ab", 32) + `"}`, ImagePullParams{}, "params.digest"},
		{`{"ref":"app","registry_auth":"../etc/passwd"}`, ImagePullParams{}, "params.registry_auth"},
		{`{"ref":"app","registry_auth":"A"}`, ImagePullParams{}, "params.registry_auth"},
		{`{"ref":"app","timeout_seconds":1801}`, ImagePullParams{}, "params.timeout_seconds"},
		{`{"ref":"app","timeout_seconds":-1}`, ImagePullParams{}, "params.timeout_seconds"},
		{`{"ref":"app","timeout_seconds":"60"}`, ImagePullParams{}, "params.timeout_seconds"},
		{`{"ref":"app","host":"/var/run/docker.sock"}`, ImagePullParams{}, "params.host"},
	}
	for _, tc := range tests {
		got, fe := DecodeImagePullParams(json.RawMessage(tc.params))
		var field string
		if len(fe) > 0 {
			field = fe[0].Field
		}
		if field != tc.fe || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %+v %v; want %+v %s", tc.params, got, fe, tc.want, tc.fe)
		}
	}
}

func TestImageRefHasTag(t *testing.T) {
	for ref, want := range map[string]bool{"app": false, "app:v1": true, "127.0.0.1:5000/app": false,
		"127.0.0.1:5000/team/app:v1": true, "registry.example/a/b": false} {
		if got := ImageRefHasTag(ref); got != want {
			t.Errorf("ImageRefHasTag(%q) = %v", ref, got)
		}
	}
}

// TestImagePullRegistered: image.pull is a built-in operators may enqueue,
// and the registry validates its params.
func TestImagePullRegistered(t *testing.T) {
	r, err := NewRegistry(Builtin()...)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := r.Lookup(TypeImagePull)
	if !ok || s.Internal || s.Timeout != ImagePullTimeout {
		t.Fatalf("spec %+v ok=%v", s, ok)
	}
	if fe := r.Validate(TypeImagePull, json.RawMessage(`{"ref":"https://x/y"}`)); len(fe) != 1 || fe[0].Field != "params.ref" {
		t.Errorf("validate: %v", fe)
	}
}
