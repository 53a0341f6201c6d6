package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TasksCmd groups task commands.
type TasksCmd struct {
	Run    TasksRunCmd    `cmd:"" help:"Queue a typed task for a node."`
	List   TasksListCmd   `cmd:"" help:"List tasks."`
	Show   TasksShowCmd   `cmd:"" help:"Show a task with its events and result."`
	Cancel TasksCancelCmd `cmd:"" help:"Cancel a task that has not finished."`
}

// TasksRunCmd enqueues a task.
type TasksRunCmd struct {
	APIFlags
	Node          string        `name:"node" help:"Target node (host) id (required without --batch)."`
	Type          string        `name:"type" help:"Task type, e.g. diag.health_probe (required without --batch)."`
	Params        string        `name:"params" default:"{}" help:"Task params as a JSON object."`
	TTL           time.Duration `name:"ttl" help:"Time to live (default 10m)."`
	CorrelationID string        `name:"correlation-id" help:"Correlation id (generated when absent)."`
	Wait          bool          `name:"wait" help:"Wait for the result and print it."`
	Timeout       time.Duration `name:"timeout" default:"5m" help:"How long --wait waits."`
	Batch         string        `name:"batch" placeholder:"FILE" help:"Queue the enqueue requests in FILE (JSON lines or a JSON array; - is stdin) through POST /api/v1/tasks:batch, 1000 a request; --wait shows progress counts."`
}

// Run implements the command.
func (c *TasksRunCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	if c.Batch != "" {
		return c.runBatch(ctx, env, cl)
	}
	if c.Node == "" || c.Type == "" {
		return fmt.Errorf("--node and --type are required (or --batch FILE)")
	}
	if !json.Valid([]byte(c.Params)) {
		return fmt.Errorf("--params: not valid JSON")
	}
	req := api.EnqueueTaskRequest{NodeID: c.Node, Type: c.Type, Params: json.RawMessage(c.Params),
		TTL: api.Duration(c.TTL), CorrelationID: c.CorrelationID}
	var t api.Task
	if err := cl.call(ctx, http.MethodPost, "/api/v1/tasks", nil, req, &t); err != nil {
		return err
	}
	if !c.Wait {
		if c.JSON {
			return printJSON(env.Stdout, t)
		}
		fmt.Fprintf(env.Stdout, "queued %s (correlation_id %s)\n", t.ID, t.CorrelationID)
		return nil
	}
	fmt.Fprintf(env.Stderr, "queued %s for %s (correlation_id %s); waiting\n", t.ID, t.NodeID, t.CorrelationID)
	deadline := time.Now().Add(c.Timeout)
	for !t.State.Terminal() {
		if time.Now().After(deadline) {
			return fmt.Errorf("task %s still %s after %s (correlation_id %s)", t.ID, t.State, c.Timeout, t.CorrelationID)
		}
		q := url.Values{"wait": {"30s"}}
		if err := cl.call(ctx, http.MethodGet, "/api/v1/tasks/"+url.PathEscape(t.ID), q, nil, &t); err != nil {
			return err
		}
	}
	if err := printTask(env, c.JSON, t); err != nil {
		return err
	}
	if t.State != api.TaskSucceeded {
		return fmt.Errorf("task %s %s (correlation_id %s)", t.ID, t.State, t.CorrelationID)
	}
	return nil
}

// TasksListCmd lists tasks.
type TasksListCmd struct {
	APIFlags
	Node  string `name:"node" help:"Only this node's tasks."`
	State string `name:"state" help:"Only tasks in this state."`
	Limit int    `name:"limit" default:"50"`
}

// Run implements the command.
func (c *TasksListCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	q := url.Values{"limit": {strconv.Itoa(c.Limit)}}
	if c.Node != "" {
		q.Set("node_id", c.Node)
	}
	if c.State != "" {
		q.Set("state", c.State)
	}
	var tasks []api.Task
	if err := cl.call(ctx, http.MethodGet, "/api/v1/tasks", q, nil, &tasks); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, tasks)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "TASK\tNODE\tTYPE\tSTATE\tATTEMPTS\tCREATED\tCORRELATION")
	for _, t := range tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", t.ID, t.NodeID, t.Type, t.State, t.Attempts,
			t.CreatedAt.Local().Format(time.DateTime), t.CorrelationID)
	}
	return tw.Flush()
}

// TasksShowCmd shows a task.
type TasksShowCmd struct {
	APIFlags
	TaskID string `arg:"" name:"task-id"`
}

// Run implements the command.
func (c *TasksShowCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var t api.Task
	if err := cl.call(ctx, http.MethodGet, "/api/v1/tasks/"+url.PathEscape(c.TaskID), nil, nil, &t); err != nil {
		return err
	}
	return printTask(env, c.JSON, t)
}

// TasksCancelCmd cancels a task.
type TasksCancelCmd struct {
	APIFlags
	TaskID string `arg:"" name:"task-id"`
}

// Run implements the command.
func (c *TasksCancelCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var t api.Task
	if err := cl.call(ctx, http.MethodPost, "/api/v1/tasks/"+url.PathEscape(c.TaskID)+"/cancel", nil, nil, &t); err != nil {
		return err
	}
	return printTask(env, c.JSON, t)
}

func printTask(env *Env, asJSON bool, t api.Task) error {
	if asJSON {
		return printJSON(env.Stdout, t)
	}
	fmt.Fprintf(env.Stdout, "task %s  type %s  node %s  state %s  attempts %d  correlation_id %s\n",
		t.ID, t.Type, t.NodeID, t.State, t.Attempts, t.CorrelationID)
	for _, e := range t.Events {
		line := fmt.Sprintf("  %s  %-16s %-9s", e.At.Local().Format("15:04:05.000"), e.Phase, e.Status)
		if e.DurationMS > 0 {
			line += fmt.Sprintf(" %dms", e.DurationMS)
		}
		if e.Message != "" {
			line += "  " + e.Message
		}
		fmt.Fprintln(env.Stdout, line)
	}
	if r := t.Result; r != nil {
		fmt.Fprintf(env.Stdout, "result: %s\n", r.Status)
		if r.Error != nil {
			fmt.Fprintf(env.Stdout, "error: %s: %s\n", r.Error.Code, r.Error.Message)
		}
		if len(r.Timings) > 0 {
			keys := make([]string, 0, len(r.Timings))
			for k, v := range r.Timings {
				keys = append(keys, fmt.Sprintf("timings.%s=%d", k, v))
			}
			fmt.Fprintln(env.Stdout, strings.Join(sortStrings(keys), " "))
		}
		if len(r.Output) > 0 {
			var v any
			if json.Unmarshal(r.Output, &v) == nil {
				return printJSON(env.Stdout, v)
			}
		}
	}
	return nil
}
