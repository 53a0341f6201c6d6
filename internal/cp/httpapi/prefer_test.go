package httpapi

import (
	"net/http"
	"testing"
)

func TestPrefersMinimal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   bool
	}{
		{"absent", nil, false},
		{"minimal", []string{"return=minimal"}, true},
		{"representation", []string{"return=representation"}, false},
		{"case and spaces", []string{"Return = MINIMAL"}, true},
		{"quoted", []string{`return="minimal"`}, true},
		{"among others", []string{"respond-async, wait=10", "handling=lenient, return=minimal; foo=bar"}, true},
		{"parameter only", []string{"handling=strict; return=minimal"}, false},
		{"other name", []string{"returns=minimal"}, false},
		{"no value", []string{"return"}, false},
		{"empty elements", []string{", ,return=minimal,"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodPost, "https://cp/x", nil)
			for _, v := range tc.values {
				r.Header.Add("Prefer", v)
			}
			if got := PrefersMinimal(r); got != tc.want {
				t.Fatalf("PrefersMinimal(%q) = %v, want %v", tc.values, got, tc.want)
			}
		})
	}
	r, _ := http.NewRequest(http.MethodPost, "https://cp/x", nil)
	r.Header.Set("Prefer", "wait=5, return=minimal")
	if n := testing.AllocsPerRun(100, func() { PrefersMinimal(r) }); n != 0 {
		t.Fatalf("PrefersMinimal allocates %v times", n)
	}
}
