package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/logsgw"
	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/node/runtime/mock"
	"github.com/drover-dev/drover/internal/wire/api"
)

// logsEnv is a replica and an agent on the mock runtime with one ready
// instance.
func logsEnv(t *testing.T, mutate ...func(*server.Config)) (*env, *mock.Runtime, api.Instance) {
	t.Helper()
	e := startEnv(t, openSQLite(t), mutate...)
	bt := e.createHost("logs-1")
	rt := mock.New(mock.Options{})
	e.startAgent("logs-1", bt.Token, agentOpts{rt: rt})
	e.waitHostStatus("logs-1", api.HostHealthy, 10*time.Second)
	waitCapacity(t, e, "logs-1")
	in := e.createInstance(api.CreateInstanceRequest{Name: "talker", HostID: "logs-1",
		Spec: api.InstanceSpec{Image: fakeImage, VCPUs: 1, MemoryMiB: 128}})
	e.waitPhase(in.ID, api.InstanceReady, "", 10*time.Second)
	return e, rt, in
}

// logsRequest opens GET /api/v1/instances/{id}/logs?query.
func (e *env) logsRequest(ctx context.Context, id, query string) *http.Response {
	e.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.opURL+"/api/v1/instances/"+id+"/logs?"+query, nil)
	req.Header.Set("Authorization", "Bearer "+e.opToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("logs request: %v", err)
	}
	return resp
}

// TestLogsOnMockRuntime streams an instance's logs from a real agent: the
// whole log with its end trailer, tail, follow receiving new lines, the
// client's close stopping the node's reader, and the refusals.
func TestLogsOnMockRuntime(t *testing.T) {
	e, rt, in := logsEnv(t)

	resp := e.logsRequest(context.Background(), in.ID, "")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "mock: instance " + in.ID + " started\nmock: no workload runs in the mock runtime\n"
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("logs = HTTP %d %q, want %q", resp.StatusCode, body, want)
	}
	if got := resp.Trailer.Get(logsgw.TrailerEnd); got != "eof" {
		t.Errorf("end trailer = %q, want eof", got)
	}
	if !e.auditHas("instance.logs", in.ID, "ok") {
		t.Error("no audit record of the logs stream")
	}

	rt.AppendLog(in.ID, "stdout", "third line")
	resp = e.logsRequest(context.Background(), in.ID, "tail=1")
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "third line\n" {
		t.Errorf("tail=1 = %q", body)
	}

	// Follow: new lines arrive as they are written; closing stops the node.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp = e.logsRequest(ctx, in.ID, "follow=true&tail=1")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("follow: HTTP %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	readLine := func(want string) {
		t.Helper()
		got := make(chan string, 1)
		go func() { l, _ := br.ReadString('\n'); got <- l }()
		select {
		case l := <-got:
			if l != want+"\n" {
				t.Fatalf("follow line = %q, want %q", l, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("follow: no line %q within 5s", want)
		}
	}
	readLine("third line")
	rt.AppendLog(in.ID, "stderr", "fourth line")
	readLine("fourth line")
	if n := rt.OpenLogReaders(); n != 1 {
		t.Errorf("%d log readers open while following, want 1", n)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for rt.OpenLogReaders() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the node's log reader is still open 5s after the client left")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Refusals carry a code and the correlation id.
	for _, tc := range []struct {
		id, query string
		status    int
		code      string
	}{
		{"in_nope", "", http.StatusNotFound, "instance_not_found"},
		{in.ID, "since=yesterday", http.StatusUnprocessableEntity, "invalid_query"},
		{in.ID, "tail=-1", http.StatusUnprocessableEntity, "invalid_query"},
	} {
		resp := e.logsRequest(context.Background(), tc.id, tc.query)
		var eb api.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != tc.status || eb.Error.Code != tc.code || eb.Error.CorrelationID == "" {
			t.Errorf("%s?%s = HTTP %d %+v, want %d %s with a correlation id", tc.id, tc.query, resp.StatusCode,
				eb.Error, tc.status, tc.code)
		}
	}
}

// TestLogsStreamLimit: a node's streams beyond the cap are refused 429.
func TestLogsStreamLimit(t *testing.T) {
	e, _, in := logsEnv(t, func(c *server.Config) { c.Logs.MaxStreamsPerNode = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := e.logsRequest(ctx, in.ID, "follow=true")
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first follow: HTTP %d", first.StatusCode)
	}
	second := e.logsRequest(context.Background(), in.ID, "follow=true")
	var eb api.ErrorBody
	_ = json.NewDecoder(second.Body).Decode(&eb)
	second.Body.Close()
	if second.StatusCode != http.StatusTooManyRequests || eb.Error.Code != "logs_stream_limit_node" ||
		second.Header.Get("Retry-After") == "" {
		t.Errorf("second stream = HTTP %d %+v, want 429 logs_stream_limit_node with Retry-After", second.StatusCode, eb.Error)
	}
	if !strings.Contains(eb.Error.Message, "logs-1") {
		t.Errorf("limit message %q does not name the node", eb.Error.Message)
	}
}
