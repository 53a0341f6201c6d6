package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// VolumesCmd groups the named-volume commands (microVM volumes on a host).
type VolumesCmd struct {
	List   VolumesListCmd   `cmd:"" help:"List a host's microVM volumes (queues volume.list)."`
	Delete VolumesDeleteCmd `cmd:"" help:"Delete a microVM volume and its data on a host (queues volume.delete; refused while an instance holds it)."`
}

// volumeHostFlags name the host a volume command runs on.
type volumeHostFlags struct {
	Host    string        `name:"host" aliases:"node" required:"" help:"The host (node) id whose volumes these are (--node is the same)."`
	Timeout time.Duration `name:"timeout" default:"2m" help:"How long to wait for the result."`
}

// VolumesListCmd queues volume.list and prints the volumes.
type VolumesListCmd struct {
	APIFlags
	volumeHostFlags
}

// Run implements the command.
func (c *VolumesListCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	t, err := runHostTask(ctx, cl, c.Host, task.TypeVolumeList, task.VolumeListParams{}, c.Timeout)
	if err != nil {
		return err
	}
	var out task.VolumeListOutput
	if err := json.Unmarshal(t.Result.Output, &out); err != nil {
		return fmt.Errorf("task %s: output: %w", t.ID, err)
	}
	if c.JSON {
		return printJSON(env.Stdout, out)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "NAME\tFORMAT\tSIZE\tHELD BY\tCREATED")
	for _, v := range out.Volumes {
		held := strings.Join(v.Holders, ",")
		if held == "" {
			held = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d GiB\t%s\t%s\n", v.Name, v.Format, v.SizeGiB, held, v.CreatedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// VolumesDeleteCmd queues volume.delete after a confirmation.
type VolumesDeleteCmd struct {
	APIFlags
	volumeHostFlags
	Yes
	Name string `arg:"" help:"The volume's name."`
}

// Run implements the command.
func (c *VolumesDeleteCmd) Run(ctx context.Context, env *Env) error {
	if !api.ValidVolumeName(c.Name) {
		return fmt.Errorf("%q is not a volume name (%s, no \"..\")", c.Name, api.VolumeNamePattern)
	}
	if err := c.confirm(env, fmt.Sprintf("Deleting volume %s on %s (and its data)", c.Name, c.Host), c.Name); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	t, err := runHostTask(ctx, cl, c.Host, task.TypeVolumeDelete, task.VolumeDeleteParams{Name: c.Name}, c.Timeout)
	if err != nil {
		return err
	}
	var out task.VolumeDeleteOutput
	if err := json.Unmarshal(t.Result.Output, &out); err != nil {
		return fmt.Errorf("task %s: output: %w", t.ID, err)
	}
	if c.JSON {
		return printJSON(env.Stdout, out)
	}
	if !out.Deleted {
		fmt.Fprintf(env.Stdout, "no volume %s on %s: nothing to delete\n", c.Name, t.NodeID)
		return nil
	}
	fmt.Fprintf(env.Stdout, "deleted volume %s on %s\n", c.Name, t.NodeID)
	return nil
}

// runHostTask queues a task of typ with params for host, waits for its
// end and returns it when it succeeded; a failure is an error with the
// result's code and message.
func runHostTask(ctx context.Context, cl *operatorClient, host, typ string, params any, timeout time.Duration) (api.Task, error) {
	p, err := json.Marshal(params)
	if err != nil {
		return api.Task{}, err
	}
	var t api.Task
	req := api.EnqueueTaskRequest{NodeID: host, Type: typ, Params: p}
	if err := cl.call(ctx, http.MethodPost, "/api/v1/tasks", nil, req, &t); err != nil {
		return api.Task{}, err
	}
	deadline := time.Now().Add(timeout)
	for !t.State.Terminal() {
		if time.Now().After(deadline) {
			return t, fmt.Errorf("task %s still %s after %s (correlation_id %s; drover tasks show %s)", t.ID, t.State, timeout, t.CorrelationID, t.ID)
		}
		q := url.Values{"wait": {pollEvery.String()}}
		if err := cl.call(ctx, http.MethodGet, "/api/v1/tasks/"+url.PathEscape(t.ID), q, nil, &t); err != nil {
			return t, err
		}
	}
	if r := t.Result; t.State != api.TaskSucceeded || r == nil {
		if r != nil && r.Error != nil {
			return t, fmt.Errorf("%s on %s failed: %s: %s (task %s, correlation_id %s)", typ, t.NodeID, r.Error.Code, r.Error.Message, t.ID, t.CorrelationID)
		}
		return t, fmt.Errorf("task %s %s (correlation_id %s)", t.ID, t.State, t.CorrelationID)
	}
	return t, nil
}
