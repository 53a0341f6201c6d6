package cli

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/drover-dev/drover/internal/wire/api"
)

// InstancesCmd groups instance commands.
type InstancesCmd struct {
	Create InstancesCreateCmd `cmd:"" help:"Declare an instance; the control plane places it and its agent runs it."`
	List   InstancesListCmd   `cmd:"" help:"List instances."`
	Show   InstancesShowCmd   `cmd:"" help:"Show one instance (by id or name)."`
	Stop   InstanceRefCmd     `cmd:"" help:"Set an instance's desired state to stopped."`
	Start  InstanceRefCmd     `cmd:"" help:"Set an instance's desired state to running (retries a Failed one)."`
	Delete InstancesDeleteCmd `cmd:"" help:"Stop and destroy an instance; the record goes once its agent reports it stopped."`
	Scale  InstancesScaleCmd  `cmd:"" help:"Create or delete members <group>-<n> until --replicas are wanted."`
	Logs   InstancesLogsCmd   `cmd:"" help:"Print an instance's logs (container stdout/stderr, a VM's serial log); --follow streams new lines."`
}

// InstancesCreateCmd creates an instance.
type InstancesCreateCmd struct {
	APIFlags
	Name         string            `arg:"" help:"Instance name ([a-z0-9][a-z0-9-]*, at most 63)."`
	Spec         string            `name:"spec" type:"existingfile" help:"A JSON api.InstanceSpec to start from; the flags below override it."`
	ImageURL     string            `name:"image-url" help:"Disk image URL (http, https, or file under the agent's image directories)."`
	ImageSHA256  string            `name:"image-sha256" help:"Lowercase hex SHA-256 of the image."`
	KernelURL    string            `name:"kernel-url" help:"Boot this kernel directly instead of the disk's bootloader."`
	KernelSHA256 string            `name:"kernel-sha256"`
	InitrdURL    string            `name:"initrd-url"`
	InitrdSHA256 string            `name:"initrd-sha256"`
	Cmdline      string            `name:"cmdline" help:"Kernel command line for direct boot."`
	VCPUs        int               `name:"vcpus"`
	MemoryMiB    int               `name:"memory-mib"`
	DiskGiB      int               `name:"disk-gib" help:"Overlay size (default: the image's size)."`
	GPUs         string            `name:"gpus" help:"A VM's GPU count; with --preset: all (default), none, or GPU indices or UUIDs (0,1)."`
	Slot         []string          `name:"slot" help:"Approved slot id on the host (repeatable)."`
	Host         string            `name:"host" aliases:"node" xor:"placement" help:"Run on this host (--node is the same)."`
	HostLabel    map[string]string `name:"host-label" xor:"placement" help:"Place on a host with these labels, key=value (repeatable)."`
	Group        string            `name:"group" help:"Instance group."`
	Label        map[string]string `name:"label" help:"Instance labels, key=value (repeatable)."`
	Forward      []string          `name:"forward" help:"Port forward name:guestport[:hostport] on 127.0.0.1 (repeatable; hostport 0 or absent: the agent picks)."`
	ReadyMarker  string            `name:"ready-marker" help:"Ready when this text appears on the serial console."`
	ReadyPort    int               `name:"ready-port" help:"Ready when this guest TCP port accepts connections (needs a forward)."`
	SSHKey       []string          `name:"ssh-key" type:"existingfile" sep:"none" help:"Authorized keys file for cloud-init (repeatable)."`
	User         string            `name:"user" help:"cloud-init user."`
	Preset       string            `name:"preset" enum:",vllm,ollama" default:"" help:"Run an inference server from a preset (vllm or ollama) instead of --spec and the VM flags; the control plane expands it (docs/runbooks/inference.md)."`
	Model        string            `name:"model" help:"With --preset: the model (vllm: a Hugging Face id, default mistralai/Mistral-7B-Instruct-v0.1; ollama: default llama2)."`
	Port         int               `name:"port" help:"With --preset: the server's port, forwarded on the host's 127.0.0.1 (vllm 8000, ollama 11434)."`
	TensorPar    int               `name:"tensor-parallel" help:"With --preset vllm: tensor parallel size (default 1; at most the GPUs given)."`
	MaxModelLen  int               `name:"max-model-len" help:"With --preset vllm: max model length (default 4096)."`
}

// Run implements the command.
func (c *InstancesCreateCmd) Run(ctx context.Context, env *Env) error {
	req, err := c.request()
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	var in api.Instance
	if err := cl.call(ctx, http.MethodPost, "/api/v1/instances", nil, req, &in); err != nil {
		return err
	}
	return printInstance(env, c.JSON, in)
}

// request builds the create request from --spec and the flags.
func (c *InstancesCreateCmd) request() (api.CreateInstanceRequest, error) {
	req := api.CreateInstanceRequest{Name: c.Name, Group: c.Group, HostID: c.Host, HostLabels: c.HostLabel, Labels: c.Label}
	if c.Preset != "" || c.Model != "" || c.Port != 0 || c.TensorPar != 0 || c.MaxModelLen != 0 {
		return c.presetRequest(req)
	}
	s := &req.Spec
	if c.Spec != "" {
		b, err := os.ReadFile(c.Spec)
		if err != nil {
			return req, err
		}
		if err := api.DecodeStrict(bytes.NewReader(b), s); err != nil {
			return req, fmt.Errorf("--spec %s: %w", c.Spec, err)
		}
	}
	setStr := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	setInt := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	setStr(&s.Image.URL, c.ImageURL)
	setStr(&s.Image.SHA256, c.ImageSHA256)
	if c.KernelURL != "" || c.KernelSHA256 != "" || c.InitrdURL != "" || c.InitrdSHA256 != "" || c.Cmdline != "" {
		if s.Boot == nil {
			s.Boot = &api.DirectBoot{}
		}
		setStr(&s.Boot.Kernel.URL, c.KernelURL)
		setStr(&s.Boot.Kernel.SHA256, c.KernelSHA256)
		if c.InitrdURL != "" || c.InitrdSHA256 != "" {
			if s.Boot.Initrd == nil {
				s.Boot.Initrd = &api.Artifact{}
			}
			setStr(&s.Boot.Initrd.URL, c.InitrdURL)
			setStr(&s.Boot.Initrd.SHA256, c.InitrdSHA256)
		}
		setStr(&s.Boot.Cmdline, c.Cmdline)
	}
	setInt(&s.VCPUs, c.VCPUs)
	setInt(&s.MemoryMiB, c.MemoryMiB)
	setInt(&s.DiskGiB, c.DiskGiB)
	if c.GPUs != "" {
		n, err := strconv.Atoi(c.GPUs)
		if err != nil {
			return req, fmt.Errorf("--gpus %q: a VM takes a GPU count (GPU indices go with --preset)", c.GPUs)
		}
		s.GPUs = n
	}
	if len(c.Slot) > 0 {
		s.Slots = c.Slot
	}
	if len(c.Forward) > 0 {
		s.Network.Forwards = nil
		for _, f := range c.Forward {
			pf, err := parseForward(f)
			if err != nil {
				return req, err
			}
			s.Network.Forwards = append(s.Network.Forwards, pf)
		}
	}
	setStr(&s.Readiness.SerialMarker, c.ReadyMarker)
	setInt(&s.Readiness.TCPPort, c.ReadyPort)
	if c.User != "" || len(c.SSHKey) > 0 {
		if s.CloudInit == nil {
			s.CloudInit = &api.CloudInit{}
		}
		setStr(&s.CloudInit.User, c.User)
		for _, path := range c.SSHKey {
			keys, err := readAuthorizedKeys(path)
			if err != nil {
				return req, err
			}
			s.CloudInit.SSHAuthorizedKeys = append(s.CloudInit.SSHAuthorizedKeys, keys...)
		}
	}
	return req, nil
}

// parseForward reads name:guestport[:hostport].
func parseForward(s string) (api.PortForward, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
		return api.PortForward{}, fmt.Errorf("--forward %q: want name:guestport[:hostport]", s)
	}
	pf := api.PortForward{Name: parts[0]}
	var err error
	if pf.GuestPort, err = strconv.Atoi(parts[1]); err != nil {
		return api.PortForward{}, fmt.Errorf("--forward %q: guest port: %w", s, err)
	}
	if len(parts) == 3 {
		if pf.HostPort, err = strconv.Atoi(parts[2]); err != nil {
			return api.PortForward{}, fmt.Errorf("--forward %q: host port: %w", s, err)
		}
	}
	return pf, nil
}

// readAuthorizedKeys returns the key lines of an authorized_keys file.
func readAuthorizedKeys(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			keys = append(keys, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--ssh-key %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("--ssh-key %s: no keys in the file", path)
	}
	return keys, nil
}

// InstancesListCmd lists instances.
type InstancesListCmd struct {
	APIFlags
	Host  string `name:"host" help:"Only this host's instances."`
	Group string `name:"group" help:"Only this group's instances."`
}

// Run implements the command.
func (c *InstancesListCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	q := url.Values{}
	if c.Host != "" {
		q.Set("host", c.Host)
	}
	if c.Group != "" {
		q.Set("group", c.Group)
	}
	var list []api.Instance
	if err := cl.call(ctx, http.MethodGet, "/api/v1/instances", q, nil, &list); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, list)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "NAME\tID\tHOST\tGROUP\tDESIRED\tPHASE\tREASON\tGEN\tCREATED")
	for _, in := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", in.Name, in.ID, in.HostID, dash(in.Group),
			in.DesiredState, in.Phase, dash(string(in.ReasonCode)), in.ObservedGeneration, in.Generation,
			in.CreatedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// InstancesShowCmd shows an instance, optionally waiting for a phase.
type InstancesShowCmd struct {
	APIFlags
	Ref       string        `arg:"" name:"instance" help:"Instance id or name."`
	WaitPhase string        `name:"wait-phase" help:"Wait until the instance reaches this phase (Pending, Booting, Ready, Draining, Stopped, Failed), re-reading it every 500ms; a Failed instance ends the wait with its reason."`
	Timeout   time.Duration `name:"timeout" default:"5m" help:"How long --wait-phase waits."`
}

// Run implements the command.
func (c *InstancesShowCmd) Run(ctx context.Context, env *Env) error {
	want := api.InstancePhase(c.WaitPhase)
	if want != "" && !api.ValidInstancePhase(want) {
		return fmt.Errorf("--wait-phase %q: not a phase", c.WaitPhase)
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	path := "/api/v1/instances/" + url.PathEscape(c.Ref)
	var in api.Instance
	if err := cl.call(ctx, http.MethodGet, path, nil, nil, &in); err != nil {
		return err
	}
	deadline := time.Now().Add(c.Timeout)
	for want != "" && in.Phase != want {
		if in.Phase == api.InstanceFailed {
			return fmt.Errorf("instance %s Failed (%s): %s", in.Name, dash(string(in.ReasonCode)), in.Message)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("instance %s still %s after %s, want %s", in.Name, in.Phase, c.Timeout, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if err := cl.call(ctx, http.MethodGet, path, nil, nil, &in); err != nil {
			return err
		}
	}
	return printInstance(env, c.JSON, in)
}

// InstanceRefCmd acts on one instance: stop and start.
type InstanceRefCmd struct {
	APIFlags
	Ref string `arg:"" name:"instance" help:"Instance id or name."`
}

// Run implements stop and start; the verb is the command's name.
func (c *InstanceRefCmd) Run(ctx context.Context, env *Env, kctx *kong.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	verb := strings.Fields(kctx.Command())[1]
	var in api.Instance
	if err := cl.call(ctx, http.MethodPost, "/api/v1/instances/"+url.PathEscape(c.Ref)+"/"+verb, nil, nil, &in); err != nil {
		return err
	}
	return printInstance(env, c.JSON, in)
}

// InstancesDeleteCmd deletes an instance.
type InstancesDeleteCmd struct {
	APIFlags
	Ref   string `arg:"" name:"instance" help:"Instance id or name."`
	Force bool   `name:"force" help:"Remove the record at once, without waiting for the agent (for a host that is gone)."`
}

// Run implements the command.
func (c *InstancesDeleteCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var q url.Values
	if c.Force {
		q = url.Values{"force": {"true"}}
	}
	var in api.Instance
	if err := cl.call(ctx, http.MethodDelete, "/api/v1/instances/"+url.PathEscape(c.Ref), q, nil, &in); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, in)
	}
	if c.Force {
		fmt.Fprintf(env.Stdout, "removed %s (%s) from host %s\n", in.Name, in.ID, in.HostID)
		return nil
	}
	fmt.Fprintf(env.Stdout, "deleting %s (%s) at generation %d; the record goes once host %s reports it stopped\n",
		in.Name, in.ID, in.Generation, in.HostID)
	return nil
}

// InstancesScaleCmd scales a group.
type InstancesScaleCmd struct {
	APIFlags
	Group     string            `arg:"" name:"group"`
	Replicas  int               `name:"replicas" required:"" help:"How many live members the group should have."`
	HostLabel map[string]string `name:"host-label" help:"Place new members on hosts with these labels, key=value (repeatable)."`
	Template  string            `name:"template" type:"existingfile" help:"A JSON api.CreateInstanceRequest for new members (needed only for an empty group; default: the group's lowest-numbered member)."`
}

// Run implements the command.
func (c *InstancesScaleCmd) Run(ctx context.Context, env *Env) error {
	req := api.ScaleRequest{Replicas: c.Replicas, HostLabels: c.HostLabel}
	if c.Template != "" {
		b, err := os.ReadFile(c.Template)
		if err != nil {
			return err
		}
		var tmpl api.CreateInstanceRequest
		if err := api.DecodeStrict(bytes.NewReader(b), &tmpl); err != nil {
			return fmt.Errorf("--template %s: %w", c.Template, err)
		}
		req.Template = &tmpl
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	var res api.ScaleResponse
	if err := cl.call(ctx, http.MethodPost, "/api/v1/instance-groups/"+url.PathEscape(c.Group)+"/scale", nil, req, &res); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, res)
	}
	for _, in := range res.Created {
		fmt.Fprintf(env.Stdout, "created %s (%s) on %s\n", in.Name, in.ID, in.HostID)
	}
	for _, id := range res.Deleted {
		fmt.Fprintf(env.Stdout, "deleting %s\n", id)
	}
	fmt.Fprintf(env.Stdout, "group %s: %d replicas wanted\n", res.Group, res.Replicas)
	return nil
}

func printInstance(env *Env, asJSON bool, in api.Instance) error {
	if asJSON {
		return printJSON(env.Stdout, in)
	}
	tw := table(env.Stdout)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("instance_id", in.ID)
	row("name", in.Name)
	row("group", dash(in.Group))
	row("host_id", in.HostID)
	row("desired_state", in.DesiredState)
	row("phase", in.Phase)
	if in.ReasonCode != "" {
		row("reason_code", in.ReasonCode)
	}
	if in.Message != "" {
		row("message", in.Message)
	}
	row("generation", fmt.Sprintf("%d (observed %d)", in.Generation, in.ObservedGeneration))
	s := in.Spec
	row("image", s.Image.URL)
	row("resources", fmt.Sprintf("%d vCPU, %d MiB, %d GiB disk, %d GPU", s.VCPUs, s.MemoryMiB, s.DiskGiB, s.GPUs))
	if len(s.Slots) > 0 {
		row("slots", strings.Join(s.Slots, ","))
	}
	if rt := in.Runtime; rt != nil {
		row("runtime", fmt.Sprintf("%s pid %d accel %s restarts %d", dash(rt.Runtime), rt.PID, dash(rt.Accel), rt.Restarts))
		for name, port := range rt.Ports {
			row("port "+name, fmt.Sprintf("127.0.0.1:%d", port))
		}
	}
	if in.StatusAt != nil {
		row("status_at", in.StatusAt.Local().Format(time.RFC3339))
	}
	row("created", in.CreatedAt.Local().Format(time.RFC3339)+" by "+dash(in.CreatedBy))
	for k, v := range in.Labels {
		row("label "+k, v)
	}
	return tw.Flush()
}
