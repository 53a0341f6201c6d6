package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Start starts a created or stopped container; a running one is a no-op.
// Readiness is then watched in the background (EventReady).
func (r *Runtime) Start(ctx context.Context, id string) (runtime.Status, error) {
	defer r.lock(id)()
	ins, err := r.inspect(ctx, "start", id)
	if err != nil {
		return runtime.Status{}, err
	}
	if ins.State != nil && ins.State.Running {
		return r.status(ins), nil
	}
	_ = os.Remove(r.stopMarker(id))
	r.resetReady(id)
	if _, err := r.cli.ContainerStart(ctx, containerName(id), client.ContainerStartOptions{}); err != nil {
		return runtime.Status{}, r.fail(api.ReasonContainerStartFailed, "start", id, fmt.Errorf("start container: %w", gpuHint(err)))
	}
	if ins, err = r.inspect(ctx, "start", id); err != nil {
		return runtime.Status{}, err
	}
	r.watchReady(id)
	return r.status(ins), nil
}

// Stop sends the image's stop signal (SIGTERM when it names none), waits
// up to graceful, then kills the container and reports HardStopped.
// Stopping a container that is not running is a no-op.
func (r *Runtime) Stop(ctx context.Context, id string, graceful time.Duration) (runtime.StopResult, error) {
	defer r.lock(id)()
	ins, err := r.inspect(ctx, "stop", id)
	if err != nil {
		return runtime.StopResult{}, err
	}
	if ins.State == nil || !ins.State.Running {
		return runtime.StopResult{}, nil
	}
	if err := os.WriteFile(r.stopMarker(id), nil, 0o600); err != nil {
		return runtime.StopResult{}, runtime.Errorf(api.ReasonContainerStartFailed, "stop", id, "stop marker: %w", err)
	}
	sig := "SIGTERM"
	if ins.Config != nil && ins.Config.StopSignal != "" {
		sig = ins.Config.StopSignal
	}
	start := time.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wait := r.cli.ContainerWait(wctx, containerName(id), client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	if _, err := r.cli.ContainerKill(ctx, containerName(id), client.ContainerKillOptions{Signal: sig}); err != nil && !isNotRunning(err) {
		return runtime.StopResult{}, r.fail(api.ReasonContainerStartFailed, "stop", id, fmt.Errorf("signal %s: %w", sig, err))
	}
	timer := time.NewTimer(graceful)
	defer timer.Stop()
	select {
	case <-wait.Result:
		return runtime.StopResult{Took: time.Since(start)}, nil
	case err := <-wait.Error:
		if ctx.Err() != nil {
			return runtime.StopResult{}, runtime.Errorf(api.ReasonContainerStartFailed, "stop", id, "wait: %w", ctx.Err())
		}
		r.log.Warn("container wait failed; killing", "instance", id, "err", err)
	case <-timer.C:
	case <-ctx.Done():
		return runtime.StopResult{}, runtime.Errorf(api.ReasonContainerStartFailed, "stop", id, "wait: %w", ctx.Err())
	}
	if _, err := r.cli.ContainerKill(ctx, containerName(id), client.ContainerKillOptions{Signal: "SIGKILL"}); err != nil && !isNotRunning(err) {
		return runtime.StopResult{}, r.fail(api.ReasonContainerStartFailed, "stop", id, fmt.Errorf("kill: %w", err))
	}
	for ctx.Err() == nil { // until the engine has it exited
		if ins, err := r.inspect(ctx, "stop", id); err != nil || ins.State == nil || !ins.State.Running {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return runtime.StopResult{HardStopped: true, Took: time.Since(start)}, nil
}

// isNotRunning reports an engine refusing to signal an exited container.
func isNotRunning(err error) bool {
	return err != nil && (isNotFound(err) || strings.Contains(err.Error(), "is not running"))
}

// Destroy removes the container (killing it if it runs) with its
// anonymous volumes, then its secrets tmpfs and stop marker. Named
// volumes are kept. An unknown id is a no-op.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	defer r.lock(id)()
	r.forgetReady(id)
	_, err := r.cli.ContainerRemove(ctx, containerName(id), client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !isNotFound(err) {
		return r.fail(api.ReasonContainerStartFailed, "destroy", id, fmt.Errorf("remove container: %w", err))
	}
	if err := wipeSecrets(r.secretsDir(id)); err != nil {
		return runtime.Errorf(api.ReasonSecretsInjectionFailed, "destroy", id, "%w", err)
	}
	_ = os.Remove(r.stopMarker(id))
	return nil
}

// Inspect returns an instance's status; ErrNotFound when it has no
// container.
func (r *Runtime) Inspect(ctx context.Context, id string) (runtime.Status, error) {
	ins, err := r.inspect(ctx, "inspect", id)
	if err != nil {
		return runtime.Status{}, err
	}
	return r.status(ins), nil
}

// List returns every container the adapter made.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	items, err := r.listOwn(ctx)
	if err != nil {
		return nil, err
	}
	var out []runtime.Status
	for _, c := range items {
		id := c.Labels[LabelInstance]
		if !ownContainer(c) {
			continue
		}
		if st, err := r.Inspect(ctx, id); err == nil {
			out = append(out, st)
		} else if !errors.Is(err, runtime.ErrNotFound) {
			return nil, err
		}
	}
	return out, nil
}

// Recover re-adopts the adapter's containers after an agent restart:
// running ones keep running and have their readiness watched again.
// Containers carrying the instance label that are not an instance's
// (another name, no readable spec) are removed, and secrets and stop
// markers of instances without a container are wiped.
func (r *Runtime) Recover(ctx context.Context) ([]runtime.Status, error) {
	items, err := r.listOwn(ctx)
	if err != nil {
		return nil, err
	}
	var out []runtime.Status
	have := map[string]bool{}
	for _, c := range items {
		id := c.Labels[LabelInstance]
		if !ownContainer(c) {
			r.log.Warn("removing orphan container", "container", c.ID, "names", c.Names)
			if _, err := r.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !isNotFound(err) {
				return nil, r.fail(api.ReasonContainerStartFailed, "recover", id, fmt.Errorf("remove orphan %s: %w", c.ID, err))
			}
			continue
		}
		st, err := r.Inspect(ctx, id)
		if err != nil {
			return nil, err
		}
		have[id] = true
		if st.State == runtime.StateRunning {
			st.Adopted = true
			r.watchReady(id)
		}
		out = append(out, st)
	}
	for _, sub := range []string{"secrets", "stopped"} {
		entries, _ := os.ReadDir(filepath.Join(r.opts.Root, sub))
		for _, e := range entries {
			if have[e.Name()] {
				continue
			}
			p := filepath.Join(r.opts.Root, sub, e.Name())
			if sub == "secrets" {
				_ = wipeSecrets(p)
			} else {
				_ = os.Remove(p)
			}
		}
	}
	return out, nil
}

// listOwn lists the containers carrying the instance label.
func (r *Runtime) listOwn(ctx context.Context) ([]container.Summary, error) {
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", LabelInstance)})
	if err != nil {
		return nil, r.fail(api.ReasonContainerStartFailed, "list", "", fmt.Errorf("list containers: %w", err))
	}
	return res.Items, nil
}

// ownContainer reports whether a labelled container is an instance's: a
// valid id, its name, a spec that decodes.
func ownContainer(c container.Summary) bool {
	id := c.Labels[LabelInstance]
	if !runtime.ValidID(id) {
		return false
	}
	named := false
	for _, n := range c.Names {
		if strings.TrimPrefix(n, "/") == containerName(id) {
			named = true
		}
	}
	var s runtime.Spec
	return named && json.Unmarshal([]byte(c.Labels[LabelSpec]), &s) == nil && s.ID == id
}

// inspect fetches an instance's container; ErrNotFound when it has none.
func (r *Runtime) inspect(ctx context.Context, op, id string) (container.InspectResponse, error) {
	res, err := r.cli.ContainerInspect(ctx, containerName(id), client.ContainerInspectOptions{})
	if isNotFound(err) {
		return container.InspectResponse{}, notFound(op, id)
	}
	if err != nil {
		return container.InspectResponse{}, r.fail(api.ReasonContainerStartFailed, op, id, fmt.Errorf("inspect: %w", err))
	}
	return res.Container, nil
}

func (r *Runtime) stopMarker(id string) string { return filepath.Join(r.opts.Root, "stopped", id) }
func (r *Runtime) secretsDir(id string) string { return filepath.Join(r.opts.Root, "secrets", id) }

// status is an instance's Status from its container.
func (r *Runtime) status(ins container.InspectResponse) runtime.Status {
	var spec runtime.Spec
	if ins.Config != nil {
		_ = json.Unmarshal([]byte(ins.Config.Labels[LabelSpec]), &spec)
	}
	st := runtime.Status{ID: spec.ID, Owner: spec.Owner, Spec: spec, State: runtime.StateCreated}
	s := ins.State
	if s == nil {
		return st
	}
	st.StartedAt = engineTime(s.StartedAt)
	switch {
	case s.Running:
		st.State, st.PID = runtime.StateRunning, s.Pid
		st.Ports = r.hostPorts(ins, spec)
		st.Ready = r.isReady(spec.ID)
	case st.StartedAt.IsZero():
		st.State = runtime.StateCreated
	default:
		st.ExitedAt = engineTime(s.FinishedAt)
		st.ExitDetail = "exit code " + strconv.Itoa(s.ExitCode)
		_, statErr := os.Stat(r.stopMarker(spec.ID))
		asked := statErr == nil
		switch {
		case s.OOMKilled:
			st.State, st.ExitReason = runtime.StateCrashed, api.ReasonOOMKilled
			st.ExitDetail += ": the container exceeded its memory limit"
		case asked || s.ExitCode == 0:
			st.State = runtime.StateStopped
		default:
			st.State = runtime.StateCrashed
			if s.Error != "" {
				st.ExitDetail += ": " + s.Error
			}
		}
	}
	return st
}

// engineTime parses the engine's timestamps (the zero time for "never").
func engineTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() < 2000 {
		return time.Time{}
	}
	return t
}

// hostPorts maps each forward's name to its host port: the published
// binding, or with host networking the container's own port.
func (r *Runtime) hostPorts(ins container.InspectResponse, spec runtime.Spec) map[string]int {
	if len(spec.Ports) == 0 {
		return nil
	}
	out := map[string]int{}
	for _, p := range spec.Ports {
		if hp := r.hostPort(ins, p.GuestPort); hp > 0 {
			out[p.Name] = hp
		}
	}
	return out
}

// hostPort is where the agent reaches a container port on 127.0.0.1.
func (r *Runtime) hostPort(ins container.InspectResponse, guest int) int {
	if r.opts.Network == "host" {
		return guest
	}
	if ins.NetworkSettings == nil {
		return 0
	}
	port, err := network.ParsePort(strconv.Itoa(guest) + "/tcp")
	if err != nil {
		return 0
	}
	for _, b := range ins.NetworkSettings.Ports[port] {
		if hp, err := strconv.Atoi(b.HostPort); err == nil && hp > 0 {
			return hp
		}
	}
	return 0
}
