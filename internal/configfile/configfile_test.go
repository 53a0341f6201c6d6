package configfile

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseLines: the three formats give the same entries, each with its
// key's line, in line order.
func TestParseLines(t *testing.T) {
	t.Parallel()
	want := []Entry{{"name", "x", 2}, {"count", int64(3), 4}, {"on", true, 5}, {"list", []any{"a", "b"}, 6}}
	for f, data := range map[Format]string{
		TOML: "# c\nname = \"x\"\n\ncount = 3\non = true\nlist = [\"a\", \"b\"]\n",
		YAML: "# c\nname: x\n\ncount: 3\n\"on\": true\nlist: [a, b]\n",
		JSON: "{\n\"name\": \"x\",\n\n\"count\": 3,\n\"on\": true,\n\"list\": [\"a\", \"b\"]}\n",
	} {
		got, err := Parse("f", f, []byte(data))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", f, diff)
		}
	}
}

func TestFormatOf(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]Format{"a.toml": TOML, "a.YAML": YAML, "a.yml": YAML, "x/a.json": JSON, "a.env": "", "env": ""} {
		if got, ok := FormatOf(path); got != want || ok != (want != "") {
			t.Errorf("FormatOf(%q) = %q, %v", path, got, ok)
		}
	}
}
