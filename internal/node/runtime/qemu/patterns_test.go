package qemu

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

// TestPatterns checks that each name rule's compact form (an uncounted
// expression plus a length range) accepts exactly what its documented,
// counted form does.
func TestPatterns(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		p                      pattern.Pattern
		prefix, valid, invalid string
	}{
		{"ifnameRE", ifnameRE, "", "aZ09_.-", "/"},
		{"secretRE", secretRE, "", "aZ09_.-", "/"},
	} {
		if err := pattern.Check(tc.p, tc.prefix, tc.valid, tc.invalid, 1); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
