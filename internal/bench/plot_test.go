package bench

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// wellFormed parses svg as XML to the end.
func wellFormed(t *testing.T, svg []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
	}
}

func TestChartSVG(t *testing.T) {
	c := Chart{Title: "T <&>", XLabel: "time (s)", YLabel: "agents back",
		Series: []Series{{Name: "run", X: []float64{0, 5, 10}, Y: []float64{0, 50, 100}}}, VLine: 15}
	svg, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, svg)
	s := string(svg)
	for _, want := range []string{">time (s)</text>", ">agents back</text>", "T &lt;&amp;&gt;", `class="target"`} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// x axis 0..20 (15 rounds up to 20), y axis 0..100; plot area
	// x 70..620, y 350..40: (5, 50) is at (207.5, 195), (0, 0) at (70, 350).
	for _, want := range []string{"70.0,350.0", "207.5,195.0"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks the point %s:\n%s", want, s)
		}
	}
}

func TestChartSVGRejects(t *testing.T) {
	for name, c := range map[string]Chart{
		"no series":  {},
		"mismatched": {Series: []Series{{Name: "a", X: []float64{1, 2}, Y: []float64{1}}}},
		"empty":      {Series: []Series{{Name: "a"}}},
	} {
		if _, err := c.SVG(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{
		{0, 1}, {-3, 1}, {1, 1}, {1.1, 2}, {3, 5}, {7, 10}, {15, 20}, {20000, 20000}, {20001, 50000}, {0.03, 0.05},
	} {
		if got := niceCeil(tc.in); got != tc.want {
			t.Errorf("niceCeil(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestCumulative(t *testing.T) {
	ms := time.Millisecond
	got := cumulative([]time.Duration{50 * ms, 150 * ms, 160 * ms, 300 * ms}, 100*ms)
	want := []CurvePoint{{0, 0}, {0.1, 1}, {0.2, 3}, {0.3, 4}}
	if len(got) != len(want) {
		t.Fatalf("cumulative = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("cumulative = %v, want %v", got, want)
		}
	}
}

func TestWritePlots(t *testing.T) {
	rep := &Report{
		Heartbeats: HeartbeatReport{Agents: 3, Mode: "closed-loop", PerSecond: []int64{10, 12, 9}},
		Dispatch:   DispatchReport{Samples: 3, CDF: []Quantile{{0, 1}, {0.5, 1.2}, {1, 3}}},
		Storm:      &StormReport{Agents: 2, Curve: []CurvePoint{{0, 0}, {0.1, 2}}},
	}
	dir := t.TempDir()
	paths, err := WritePlots(rep, dir, "x-")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 3 {
		t.Fatalf("wrote %v, want 3 files", paths)
	}
	for _, name := range []string{"x-heartbeats.svg", "x-dispatch-cdf.svg", "x-reconnect-storm.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		wellFormed(t, b)
	}
	if _, err := WritePlots(&Report{}, dir, ""); err == nil {
		t.Error("an empty report: no error")
	}
}
