package integration

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/pgtest"
	"github.com/drover-dev/drover/internal/wire/api"
)

// TestReplicaLogsCrossReplica: the logs request is on replica A, the agent
// long-polls replica B and is configured with B's URL; A names itself in
// the signed logs.open (stream_url) and the agent's stream reaches A.
func TestReplicaLogsCrossReplica(t *testing.T) {
	if pg == nil {
		pgtest.Skip(t, pgErr)
	}
	dsn := pg.NewDatabase(t)
	a := startEnv(t, openPostgresDSN(t, dsn), advertiseSelf)
	b := startEnv(t, openPostgresDSN(t, dsn), advertiseSelf)
	bt := a.createHost("logs-rep")
	rt := mock.New(mock.Options{})
	b.startAgent("logs-rep", bt.Token, agentOpts{rt: rt, url: b.nodeURL})
	a.waitHostStatus("logs-rep", api.HostHealthy, 20*time.Second)
	waitCapacity(t, a, "logs-rep")
	in := a.createInstance(api.CreateInstanceRequest{Name: "talker", HostID: "logs-rep",
		Spec: api.InstanceSpec{Image: fakeImage, VCPUs: 1, MemoryMiB: 128}})
	a.waitPhase(in.ID, api.InstanceReady, "", 20*time.Second)

	resp := a.logsRequest(context.Background(), in.ID, "")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "mock: instance " + in.ID + " started\nmock: no workload runs in the mock runtime\n"
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("logs through A = HTTP %d %q, want %q", resp.StatusCode, body, want)
	}
}
