package preflight

import (
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

func goodReport() preflight.Report {
	r := preflight.Report{Schema: preflight.SchemaVersion, CorrelationID: "cid-1", NodeID: "node-a",
		Hops: []preflight.HopResult{{Hop: signal.HopNodeHeartbeat, Status: preflight.Passed}}}
	r.Classify()
	return r
}

func TestValidateReport(t *testing.T) {
	if fe := Validate(goodReport()); len(fe) != 0 {
		t.Fatalf("good report refused: %v", fe)
	}
	for _, tc := range []struct {
		field string
		edit  func(r *preflight.Report)
	}{
		{"schema", func(r *preflight.Report) { r.Schema = "drover.preflight/v0" }},
		{"hops[0].hop", func(r *preflight.Report) { r.Hops[0].Hop = "no_such_hop" }},
		{"hops[0].signal", func(r *preflight.Report) {
			r.Hops[0].Status, r.Hops[0].Signal = preflight.Failed, "no_such_signal"
		}},
		{"hops[0].signal", func(r *preflight.Report) { r.Hops[0].Status = preflight.Failed }},
		{"hops[0].status", func(r *preflight.Report) { r.Hops[0].Status = "maybe" }},
		{"hops[0].detail", func(r *preflight.Report) { r.Hops[0].Detail = strings.Repeat("x", maxDetail+1) }},
		{"hops", func(r *preflight.Report) { r.Hops = nil }},
		{"correlation_id", func(r *preflight.Report) { r.CorrelationID = "bad cid" }},
		{"classification.signal", func(r *preflight.Report) { r.Classification.Signal = "nope" }},
		{"node_id", func(r *preflight.Report) { r.NodeID = "Not A Host" }},
		{"classification.ok", func(r *preflight.Report) {
			r.Hops[0].Fail(signal.APIUnreachable, "refused") // classification left ok
		}},
	} {
		r := goodReport()
		tc.edit(&r)
		fe := Validate(r)
		found := false
		for _, f := range fe {
			found = found || f.Field == tc.field
		}
		if !found {
			t.Errorf("want a field error on %s, got %v", tc.field, fe)
		}
	}
}
