package preflight

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// ProgressLine is the stderr line printed as a hop finishes.
func ProgressLine(h preflight.HopResult) string {
	n, total := hopNumber(h.Hop)
	line := fmt.Sprintf("preflight [%2d/%d] %-34s %-7s %s", n, total, h.Hop, h.Status,
		(time.Duration(h.DurationMS) * time.Millisecond).String())
	if h.Signal != "" {
		line += "  " + string(h.Signal)
	}
	return line
}

func hopNumber(h signal.Hop) (int, int) {
	hops := signal.Hops()
	for i, info := range hops {
		if info.Hop == h {
			return i + 1, len(hops)
		}
	}
	return 0, len(hops)
}

// WriteTable prints the report as a table and the classification.
func WriteTable(w io.Writer, r *preflight.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tHOP\tSTATUS\tDURATION\tSIGNAL\tDETAIL")
	for _, h := range r.Hops {
		n, _ := hopNumber(h.Hop)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", n, h.Hop, h.Status,
			time.Duration(h.DurationMS)*time.Millisecond, orDash(string(h.Signal)), oneLine(h.Detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	c := r.Classification
	if c.OK {
		_, err := fmt.Fprintf(w, "\nresult: ok (correlation_id %s)\n", r.CorrelationID)
		return err
	}
	_, err := fmt.Fprintf(w, "\nresult: failed at %s: %s\nowner: %s\nrecovery: %s\ncorrelation_id: %s\n",
		c.Hop, c.Signal, c.Owner, c.Recovery, r.CorrelationID)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return s
}
