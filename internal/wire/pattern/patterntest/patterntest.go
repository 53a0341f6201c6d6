// Package patterntest runs pattern.Check over a package's rules in a test.
package patterntest

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/pattern"
)

// Run checks that rule p (named name in the failure) accepts exactly what
// its documented, counted form does, on prefix followed by characters of
// valid, varied with those of invalid (see pattern.Check).
func Run(t *testing.T, name string, p pattern.Pattern, prefix, valid, invalid string) {
	t.Helper()
	if err := pattern.Check(p, prefix, valid, invalid, 1); err != nil {
		t.Errorf("%s: %v", name, err)
	}
}
