package preflight

import (
	"testing"

	"github.com/drover-dev/drover/internal/wire/signal"
)

func TestClassifyFirstFailure(t *testing.T) {
	var a, b HopResult
	a.Hop, b.Hop = signal.HopNodeReadiness, signal.HopNodeRuntimeAPIReachability
	a.Fail(signal.DiskPressure, "92% used")
	b.Fail(signal.APIUnreachable, "refused")
	r := Report{Hops: []HopResult{{Hop: signal.HopNodeHeartbeat, Status: Passed}, a, b}}
	r.Classify()
	want := Classification{Hop: signal.HopNodeReadiness, Signal: signal.DiskPressure,
		Owner: "Node runtime / observability", Recovery: a.Recovery}
	if r.Classification != want || a.Recovery == "" {
		t.Errorf("Classify = %+v; want %+v", r.Classification, want)
	}
	ok := Report{Hops: []HopResult{{Hop: signal.HopNodeHeartbeat, Status: Passed}, {Hop: signal.HopAllocationBinding, Status: Skipped}}}
	ok.Classify()
	if !ok.Classification.OK || ok.Classification.Hop != "" {
		t.Errorf("all passed: %+v", ok.Classification)
	}
}
