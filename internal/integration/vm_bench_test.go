package integration

import (
	"net/http"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// BenchmarkInstanceCreateToReady measures a declared VM from the operator's
// POST /api/v1/instances to the agent's Ready report (the instance record's
// created_at → status_at, both stamped by the control plane, so polling
// adds nothing), through placement, the agent's desired-set long-poll, the
// reconciler, image cache (warm), overlay, QEMU under TCG and the serial
// marker. Compare with BenchmarkByHandToReady in internal/node/runtime/qemu (the
// same QEMU command line run by hand). Deleting each VM is not timed.
//
//	go test -run '^$' -bench InstanceCreateToReady -benchtime 5x ./internal/integration/
func BenchmarkInstanceCreateToReady(b *testing.B) {
	spec, _, imgDirs := tcgGuest(b)
	e := startEnv(b, openSQLite(b))
	bt := e.createHost("bench-vm")
	e.startAgent("bench-vm", bt.Token, agentOpts{runtime: "qemu", imageDirs: imgDirs, runtimeDir: b.TempDir()})
	e.waitHostStatus("bench-vm", api.HostHealthy, 60*time.Second)
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		in := e.createInstance(api.CreateInstanceRequest{Name: "bench", HostID: "bench-vm", Spec: spec})
		ready := e.waitPhase(in.ID, api.InstanceReady, "", 3*time.Minute)
		total += ready.StatusAt.Sub(ready.CreatedAt)
		b.StopTimer()
		if st := e.op(http.MethodDelete, "/api/v1/instances/"+in.ID, nil, nil); st != http.StatusAccepted {
			b.Fatalf("delete: HTTP %d", st)
		}
		e.waitGone(in.ID, 2*time.Minute)
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "create-to-ready-ms")
}
