package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// runBatch queues the requests of c.Batch, api.MaxTaskBatch per request.
// Requests without a correlation id share one generated for the batch, so
// --wait follows them with one list call a round.
func (c *TasksRunCmd) runBatch(ctx context.Context, env *Env, cl *operatorClient) error {
	reqs, err := readBatch(c.Batch, env)
	if err != nil {
		return fmt.Errorf("--batch %s: %w", c.Batch, err)
	}
	cid := "batch-" + rand.Text()[:16]
	for i := range reqs {
		if reqs[i].CorrelationID == "" {
			reqs[i].CorrelationID = cid
		}
		if reqs[i].TTL == 0 && reqs[i].ExpiresAt == nil {
			reqs[i].TTL = api.Duration(c.TTL)
		}
	}
	var tasks []api.Task
	for start := 0; start < len(reqs); start += api.MaxTaskBatch {
		end := min(start+api.MaxTaskBatch, len(reqs))
		var resp api.EnqueueTaskBatchResponse
		if err := cl.call(ctx, http.MethodPost, "/api/v1/tasks:batch", nil,
			api.EnqueueTaskBatchRequest{Items: reqs[start:end]}, &resp); err != nil {
			return fmt.Errorf("queue items %d-%d (correlation_id %s; %d queued before): %w", start, end-1, cid, len(tasks), err)
		}
		tasks = append(tasks, resp.Tasks...)
	}
	if !c.Wait {
		if c.JSON {
			return printJSON(env.Stdout, tasks)
		}
		fmt.Fprintf(env.Stdout, "queued %d tasks (correlation_id %s)\n", len(tasks), cid)
		return nil
	}
	fmt.Fprintf(env.Stderr, "queued %d tasks (correlation_id %s); waiting\n", len(tasks), cid)
	return c.waitBatch(ctx, env, cl, cid, tasks)
}

// waitBatch polls until every task is final, printing the counts by state
// when they change.
func (c *TasksRunCmd) waitBatch(ctx context.Context, env *Env, cl *operatorClient, cid string, tasks []api.Task) error {
	idx := make(map[string]int, len(tasks))
	for i, t := range tasks {
		idx[t.ID] = i
	}
	deadline := time.Now().Add(c.Timeout)
	last := ""
	for {
		open := 0
		counts := map[api.TaskState]int{}
		for _, t := range tasks {
			counts[t.State]++
			if !t.State.Terminal() {
				open++
			}
		}
		line := ""
		for _, st := range []api.TaskState{api.TaskQueued, api.TaskDispatched, api.TaskRunning, api.TaskSucceeded,
			api.TaskFailed, api.TaskExpired, api.TaskCanceled} {
			if counts[st] > 0 {
				line += fmt.Sprintf(" %s %d", st, counts[st])
			}
		}
		if line != last {
			fmt.Fprintf(env.Stderr, "%d/%d final:%s\n", len(tasks)-open, len(tasks), line)
			last = line
		}
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d tasks not final after %s (correlation_id %s)", open, len(tasks), c.Timeout, cid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		var got []api.Task
		q := url.Values{"correlation_id": {cid}, "limit": {strconv.Itoa(len(tasks))}}
		if err := cl.call(ctx, http.MethodGet, "/api/v1/tasks", q, nil, &got); err != nil {
			return err
		}
		for _, t := range got {
			if i, ok := idx[t.ID]; ok {
				tasks[i] = t
			}
		}
		for i, t := range tasks { // items that named their own correlation id
			if t.CorrelationID != cid && !t.State.Terminal() {
				if err := cl.call(ctx, http.MethodGet, "/api/v1/tasks/"+url.PathEscape(t.ID), nil, nil, &tasks[i]); err != nil {
					return err
				}
			}
		}
	}
	failed := 0
	for _, t := range tasks {
		if t.State != api.TaskSucceeded {
			failed++
		}
	}
	if c.JSON {
		if err := printJSON(env.Stdout, tasks); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d tasks did not succeed (correlation_id %s)", failed, len(tasks), cid)
	}
	return nil
}

// readBatch reads enqueue requests from a file (or stdin for "-"): a JSON
// array, or one JSON object a line (blank lines skipped).
func readBatch(path string, env *Env) ([]api.EnqueueTaskRequest, error) {
	var (
		b   []byte
		err error
	)
	switch {
	case path == "-" && env.Stdin == nil:
		return nil, fmt.Errorf("no standard input")
	case path == "-":
		b, err = io.ReadAll(env.Stdin)
	default:
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	var reqs []api.EnqueueTaskRequest
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '[' {
		dec := json.NewDecoder(bytes.NewReader(t))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&reqs); err != nil {
			return nil, fmt.Errorf("JSON array: %w", err)
		}
	} else {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			line := bytes.TrimSpace(sc.Bytes())
			if len(line) == 0 {
				continue
			}
			var r api.EnqueueTaskRequest
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&r); err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			reqs = append(reqs, r)
		}
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("no enqueue requests")
	}
	return reqs, nil
}
