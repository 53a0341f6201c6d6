package pattern

import (
	"strings"
	"testing"
)

func TestMatchString(t *testing.T) {
	p := Must(`^[a-z][a-z0-9-]{0,3}$`, `^[a-z][a-z0-9-]*$`, 1, 4)
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"", false}, {"a", true}, {"a-1z", true}, {"a-1zz", false}, {"1abc", false}, {"ab_c", false},
	} {
		if got := p.MatchString(tc.in); got != tc.want {
			t.Errorf("MatchString(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if p.String() != `^[a-z][a-z0-9-]{0,3}$` {
		t.Errorf("String() = %q", p.String())
	}
}

func TestCheck(t *testing.T) {
	const valid, invalid = "az09-", "_A."
	good := Must(`^[a-z][a-z0-9-]{0,3}$`, `^[a-z][a-z0-9-]*$`, 1, 4)
	if err := Check(good, "", valid, invalid, 1); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]Pattern{
		"max one too many":   Must(`^[a-z][a-z0-9-]{0,3}$`, `^[a-z][a-z0-9-]*$`, 1, 5),
		"max one too few":    Must(`^[a-z][a-z0-9-]{0,3}$`, `^[a-z][a-z0-9-]*$`, 1, 3),
		"class differs":      Must(`^[a-z][a-z0-9-]{0,3}$`, `^[a-z][a-z0-9_-]*$`, 1, 4),
		"first char differs": Must(`^[a-z][a-z0-9-]{0,3}$`, `^[a-z0-9][a-z0-9-]*$`, 1, 4),
	} {
		if err := Check(bad, "", valid, invalid, 1); err == nil {
			t.Errorf("%s: Check found no difference", name)
		} else if !strings.Contains(err.Error(), "compact form says") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCheckPrefix(t *testing.T) {
	good := Must(`^sha256:[0-9a-f]{4}$`, `^sha256:[0-9a-f]*$`, 11, 11)
	if err := Check(good, "sha256:", "0f", "g", 1); err != nil {
		t.Fatal(err)
	}
	bad := Must(`^sha256:[0-9a-f]{4}$`, `^sha256:[0-9a-f]*$`, 10, 11)
	if err := Check(bad, "sha256:", "0f", "g", 1); err == nil {
		t.Fatal("Check found no difference with a wrong minimum length")
	}
}

func TestMustPanicsOnBadRange(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for max < min")
		}
	}()
	Must(`^a$`, `^a$`, 2, 1)
}
