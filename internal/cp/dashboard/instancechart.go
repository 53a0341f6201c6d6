package dashboard

import (
	"fmt"
	"html"
	"html/template"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Timeline geometry: one lane per phase (its name in the label column),
// time running left to right across the plot, an axis row underneath.
const (
	tlLabelW = 80
	tlPlotW  = 520
	tlLaneH  = 20
	tlAxisH  = 18
	tlMinW   = 2 // a phase that lasted any time is at least this wide
)

// span is one stretch of time an instance spent in a phase.
type span struct {
	Phase      api.InstancePhase
	Reason     api.ReasonCode
	From, To   time.Time
	Actor, Msg string
}

// spansOf turns events (oldest first) into phase spans: each event's phase
// lasts until the next event that changes the phase or reason, the last
// until now (or its own time, if the clock is behind it).
func spansOf(evs []api.InstanceEvent, now time.Time) []span {
	var out []span
	for _, ev := range evs {
		if n := len(out); n > 0 && out[n-1].Phase == ev.Phase && out[n-1].Reason == ev.ReasonCode {
			continue // a desired-state change: the phase goes on
		}
		if n := len(out); n > 0 {
			out[n-1].To = ev.At
		}
		out = append(out, span{Phase: ev.Phase, Reason: ev.ReasonCode, From: ev.At, To: ev.At, Actor: ev.Actor, Msg: ev.Message})
	}
	if n := len(out); n > 0 && now.After(out[n-1].From) {
		out[n-1].To = now
	}
	return out
}

// phaseTimeline draws the instance's phases over time as an inline SVG: a
// lane per phase, labelled with its name, so a span's phase shows by its
// lane and label as well as its colour (class ph-<phase>). Every span has
// a <title> with its phase, reason, times and actor. No events: empty.
func phaseTimeline(evs []api.InstanceEvent, now time.Time) template.HTML {
	spans := spansOf(evs, now)
	if len(spans) == 0 {
		return ""
	}
	start, end := spans[0].From, spans[len(spans)-1].To
	total := end.Sub(start)
	x := func(t time.Time) int {
		if total <= 0 {
			return tlLabelW
		}
		return tlLabelW + int(int64(t.Sub(start))*tlPlotW/int64(total))
	}
	lanes := map[api.InstancePhase]int{}
	for i, p := range instancePhases {
		lanes[p] = i
	}
	wd, ht := tlLabelW+tlPlotW+10, len(instancePhases)*tlLaneH+tlAxisH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="phase-timeline" class="chart timeline-chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-labelledby="phase-timeline-title">`,
		wd, ht, wd, ht)
	fmt.Fprintf(&b, `<title id="phase-timeline-title">Phases over time: %d transitions from %s to %s (%s)</title>`,
		len(spans), start.Format("15:04:05"), end.Format("15:04:05"), total.Round(time.Millisecond))
	for i, p := range instancePhases {
		y := i * tlLaneH
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" class="label">%s</text>`, tlLabelW-6, y+14, p)
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" class="lane"/>`, tlLabelW, y+tlLaneH, tlLabelW+tlPlotW, y+tlLaneH)
	}
	for _, sp := range spans {
		lane, ok := lanes[sp.Phase]
		if !ok {
			continue
		}
		x0, w := x(sp.From), max(tlMinW, x(sp.To)-x(sp.From))
		label := string(sp.Phase)
		if sp.Reason != "" {
			label += " (" + string(sp.Reason) + ")"
		}
		tip := fmt.Sprintf("%s: %s to %s (%s), by %s", label, sp.From.Format("15:04:05.000"), sp.To.Format("15:04:05.000"),
			sp.To.Sub(sp.From).Round(time.Millisecond), sp.Actor)
		if sp.Msg != "" {
			tip += ": " + sp.Msg
		}
		fmt.Fprintf(&b, `<g class="span" data-phase="%s"><title>%s</title><rect x="%d" y="%d" width="%d" height="%d" class="ph ph-%s"/></g>`,
			html.EscapeString(string(sp.Phase)), html.EscapeString(tip), x0, lane*tlLaneH+3, w, tlLaneH-6,
			html.EscapeString(strings.ToLower(string(sp.Phase))))
	}
	axisY := len(instancePhases)*tlLaneH + 13
	fmt.Fprintf(&b, `<text x="%d" y="%d" class="value">%s</text>`, tlLabelW, axisY, start.Format("15:04:05"))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" class="value">%s</text>`, tlLabelW+tlPlotW, axisY, end.Format("15:04:05"))
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built here, every text escaped
}
