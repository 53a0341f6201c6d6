package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// ImagesCmd groups container image commands.
type ImagesCmd struct {
	Pull ImagesPullCmd `cmd:"" help:"Pre-pull a container image on a node (queues an image.pull task and shows its phases live)."`
}

// ImagesPullCmd queues image.pull and waits with live phases.
type ImagesPullCmd struct {
	APIFlags
	Node        string        `name:"node" required:"" help:"Target node (host) id; it needs a container runtime."`
	Ref         string        `arg:"" name:"ref" help:"Image reference REF[@sha256:DIGEST], e.g. registry.example/vllm/vllm-openai:v0.6.3 (a digest pins it)."`
	AuthSecret  string        `name:"auth-secret" help:"Secret on the node holding the registry credentials (NODE_AGENT_SECRETS_DIR)."`
	PullTimeout time.Duration `name:"pull-timeout" help:"Bound on the pull on the node (default 10m, at most 30m)."`
	Timeout     time.Duration `name:"timeout" default:"35m" help:"How long to wait for the result."`
}

// pollEvery is how long one wait for a task's new phases lasts.
var pollEvery = time.Second

// Run implements the command.
func (c *ImagesPullCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	ref, digest, _ := strings.Cut(c.Ref, "@")
	p := task.ImagePullParams{Ref: ref, Digest: digest, RegistryAuth: c.AuthSecret,
		TimeoutSeconds: int(c.PullTimeout.Round(time.Second) / time.Second)}
	params, err := json.Marshal(p)
	if err != nil {
		return err
	}
	var t api.Task
	req := api.EnqueueTaskRequest{NodeID: c.Node, Type: task.TypeImagePull, Params: params}
	if err := cl.call(ctx, http.MethodPost, "/api/v1/tasks", nil, req, &t); err != nil {
		return err
	}
	fmt.Fprintf(env.Stderr, "queued %s for %s (correlation_id %s); pulling %s\n", t.ID, t.NodeID, t.CorrelationID, c.Ref)
	live := env.Stdout
	if c.JSON {
		live = env.Stderr
	}
	deadline := time.Now().Add(c.Timeout)
	shown := 0
	for {
		shown = printNewEvents(live, t.Events, shown)
		if t.State.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("task %s still %s after %s (correlation_id %s; drover tasks show %s)", t.ID, t.State, c.Timeout, t.CorrelationID, t.ID)
		}
		q := url.Values{"wait": {pollEvery.String()}}
		if err := cl.call(ctx, http.MethodGet, "/api/v1/tasks/"+url.PathEscape(t.ID), q, nil, &t); err != nil {
			return err
		}
	}
	if c.JSON {
		if err := printJSON(env.Stdout, t); err != nil {
			return err
		}
	}
	r := t.Result
	if t.State != api.TaskSucceeded || r == nil {
		if r != nil && r.Error != nil {
			return fmt.Errorf("image pull on %s failed: %s: %s (task %s, correlation_id %s)", t.NodeID, r.Error.Code, r.Error.Message, t.ID, t.CorrelationID)
		}
		return fmt.Errorf("task %s %s (correlation_id %s)", t.ID, t.State, t.CorrelationID)
	}
	if !c.JSON {
		var out task.ImagePullOutput
		_ = json.Unmarshal(r.Output, &out)
		fmt.Fprintf(env.Stdout, "pulled %s on %s: image %s, %d layers, %dms\n", c.Ref, t.NodeID, out.ImageID, len(out.Layers), r.Timings["total_ms"])
	}
	return nil
}

// printNewEvents prints events[shown:] (a task's phases as they arrive)
// and returns how many are shown.
func printNewEvents(w io.Writer, events []api.TaskEvent, shown int) int {
	for _, e := range events[min(shown, len(events)):] {
		if e.Phase == "started" {
			continue
		}
		line := fmt.Sprintf("  %s  %-32s %-9s", e.At.Local().Format("15:04:05.000"), e.Phase, e.Status)
		if e.DurationMS > 0 || e.Status == "succeeded" {
			line += fmt.Sprintf(" %dms", e.DurationMS)
		}
		if e.Message != "" {
			line += "  " + e.Message
		}
		fmt.Fprintln(w, line)
	}
	return max(shown, len(events))
}
