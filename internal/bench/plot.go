package bench

// SVG line charts of a report (`drover bench plot`): heartbeats per second,
// the dispatch latency CDF and the reconnect storm's agents-back curve.
// Hand-written SVG, no dependency.

import (
	"bytes"
	"errors"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
}

// Chart is a line chart with linear axes from 0 (or the data's minimum
// when it is negative) to the data's maximum.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	// HLine, when > 0, draws a dashed horizontal line at that y (a target);
	// VLine likewise a vertical one.
	HLine, VLine float64
}

// Plot area geometry, in SVG user units.
const (
	plotW, plotH           = 640, 400
	padL, padR, padT, padB = 70, 20, 40, 50
)

// bounds returns the axes' maxima (minimum 0), rounded up to a nice value.
func (c Chart) bounds() (xmax, ymax float64) {
	for _, s := range c.Series {
		for _, x := range s.X {
			xmax = math.Max(xmax, x)
		}
		for _, y := range s.Y {
			ymax = math.Max(ymax, y)
		}
	}
	xmax = math.Max(xmax, c.VLine)
	ymax = math.Max(ymax, c.HLine)
	return niceCeil(xmax), niceCeil(ymax)
}

// niceCeil rounds v up to 1, 2 or 5 × a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// point maps a data point to SVG coordinates.
func (c Chart) point(x, y, xmax, ymax float64) (float64, float64) {
	iw, ih := float64(plotW-padL-padR), float64(plotH-padT-padB)
	return float64(padL) + x/xmax*iw, float64(plotH-padB) - y/ymax*ih
}

func fmtNum(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

func fmtCoord(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// SVG renders the chart.
func (c Chart) SVG() ([]byte, error) {
	if len(c.Series) == 0 {
		return nil, errors.New("chart: no series")
	}
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) || len(s.X) == 0 {
			return nil, fmt.Errorf("chart: series %q: %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
	}
	xmax, ymax := c.bounds()
	var b bytes.Buffer
	esc := html.EscapeString
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" text-anchor="middle">%s</text>`+"\n", plotW/2, esc(c.Title))
	// Grid and ticks: 5 divisions per axis.
	for i := 0; i <= 5; i++ {
		xv, yv := xmax*float64(i)/5, ymax*float64(i)/5
		x, _ := c.point(xv, 0, xmax, ymax)
		_, y := c.point(0, yv, xmax, ymax)
		fmt.Fprintf(&b, `<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="#ddd"/>`+"\n", fmtCoord(x), padT, fmtCoord(x), plotH-padB)
		fmt.Fprintf(&b, `<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="#ddd"/>`+"\n", padL, fmtCoord(y), plotW-padR, fmtCoord(y))
		fmt.Fprintf(&b, `<text x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", fmtCoord(x), plotH-padB+16, fmtNum(xv))
		fmt.Fprintf(&b, `<text x="%d" y="%s" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", padL-6, fmtCoord(y), fmtNum(yv))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padL, plotH-padB, plotW-padR, plotH-padB)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padL, padT, padL, plotH-padB)
	fmt.Fprintf(&b, `<text class="xlabel" x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (padL+plotW-padR)/2, plotH-12, esc(c.XLabel))
	fmt.Fprintf(&b, `<text class="ylabel" x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n",
		(padT+plotH-padB)/2, (padT+plotH-padB)/2, esc(c.YLabel))
	if c.HLine > 0 {
		x1, y := c.point(0, c.HLine, xmax, ymax)
		x2, _ := c.point(xmax, c.HLine, xmax, ymax)
		fmt.Fprintf(&b, `<line class="target" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#c00" stroke-dasharray="6 4"/>`+"\n",
			fmtCoord(x1), fmtCoord(y), fmtCoord(x2), fmtCoord(y))
	}
	if c.VLine > 0 {
		x, y1 := c.point(c.VLine, 0, xmax, ymax)
		_, y2 := c.point(c.VLine, ymax, xmax, ymax)
		fmt.Fprintf(&b, `<line class="target" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#c00" stroke-dasharray="6 4"/>`+"\n",
			fmtCoord(x), fmtCoord(y1), fmtCoord(x), fmtCoord(y2))
	}
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"}
	for i, s := range c.Series {
		col := colors[i%len(colors)]
		var pts bytes.Buffer
		for j := range s.X {
			x, y := c.point(s.X[j], s.Y[j], xmax, ymax)
			if j > 0 {
				pts.WriteByte(' ')
			}
			pts.WriteString(fmtCoord(x) + "," + fmtCoord(y))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`+"\n",
			col, pts.String(), esc(s.Name))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", padL+10, padT+14+16*i, col, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return b.Bytes(), nil
}

// ReportCharts returns the charts a report has data for, by file name.
func ReportCharts(rep *Report) map[string]Chart {
	out := map[string]Chart{}
	if hb := rep.Heartbeats; len(hb.PerSecond) > 0 {
		s := Series{Name: fmt.Sprintf("%d agents, %s", hb.Agents, hb.Mode)}
		for i, n := range hb.PerSecond {
			s.X, s.Y = append(s.X, float64(i+1)), append(s.Y, float64(n))
		}
		out["heartbeats.svg"] = Chart{Title: "Heartbeats answered per second", XLabel: "time (s)",
			YLabel: "heartbeats/s", Series: []Series{s}, HLine: TargetHeartbeatsPerSec}
	}
	if d := rep.Dispatch; len(d.CDF) > 0 {
		s := Series{Name: fmt.Sprintf("%d samples, %d idle long-polls", d.Samples, d.LongPolls)}
		for _, q := range d.CDF {
			s.X, s.Y = append(s.X, q.Ms), append(s.Y, q.Q*100)
		}
		out["dispatch-cdf.svg"] = Chart{Title: "Dispatch latency (enqueue → agent receives), CDF", XLabel: "latency (ms)",
			YLabel: "% of tasks", Series: []Series{s}}
	}
	if st := rep.Storm; st != nil && len(st.Curve) > 0 {
		s := Series{Name: fmt.Sprintf("%d agents (server ready after %.1f s)", st.Agents, st.RestartS)}
		for _, p := range st.Curve {
			s.X, s.Y = append(s.X, p.T), append(s.Y, float64(p.N))
		}
		out["reconnect-storm.svg"] = Chart{Title: "Reconnect storm: agents back after a server restart", XLabel: "time since SIGKILL (s)",
			YLabel: "agents back", Series: []Series{s}, VLine: TargetStormBackS}
	}
	return out
}

// WritePlots writes the report's charts into dir (with prefix before each
// file name) and returns the paths written.
func WritePlots(rep *Report, dir, prefix string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	charts := ReportCharts(rep)
	if len(charts) == 0 {
		return nil, errors.New("the report has nothing to plot (no per-second heartbeats, dispatch CDF or storm curve)")
	}
	var paths []string
	for _, name := range []string{"heartbeats.svg", "dispatch-cdf.svg", "reconnect-storm.svg"} {
		c, ok := charts[name]
		if !ok {
			continue
		}
		svg, err := c.SVG()
		if err != nil {
			return paths, fmt.Errorf("%s: %w", name, err)
		}
		p := filepath.Join(dir, prefix+name)
		if err := os.WriteFile(p, svg, 0o644); err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}
