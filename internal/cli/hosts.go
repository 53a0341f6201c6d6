package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/drover-dev/drover/internal/wire/api"
)

// HostsCmd groups host commands.
type HostsCmd struct {
	List        HostsListCmd   `cmd:"" help:"List hosts."`
	Create      HostsCreateCmd `cmd:"" help:"Create a host record and print its bootstrap token once."`
	Show        HostIDCmd      `cmd:"" help:"Show one host."`
	Enable      HostIDCmd      `cmd:"" help:"Enable a host (schedulable when healthy)."`
	Disable     HostIDCmd      `cmd:"" help:"Disable a host."`
	RotateToken HostIDCmd      `cmd:"" name:"rotate-token" help:"Issue a new bootstrap token; the old one stops working."`
	Revoke      HostRevokeCmd  `cmd:"" help:"Revoke a host: its certificates are refused from now on (irreversible; asks, or --yes)."`
	Drain       HostIDCmd      `cmd:"" help:"Drain a host: no new instances are placed on it, and its agent learns it is draining."`
	Undrain     HostIDCmd      `cmd:"" help:"Undrain a host: it takes new instances again."`
	Slots       HostSlotsCmd   `cmd:"" help:"List a host's approved resource slots."`
	Approve     HostApproveCmd `cmd:"" name:"approve-slots" help:"Approve candidate slots from a slice.topology_discover task."`
	Place       PlaceCmd       `cmd:"" help:"Check where work of a given size would be placed (409 says what is short)."`
	Profile     HostProfileCmd `cmd:"" help:"Set a host's environment profile: the node API and terminal URLs its agent should use."`
}

// HostProfileCmd sets a host's environment profile.
type HostProfileCmd struct {
	APIFlags
	HostID      string `arg:"" name:"host-id"`
	APIURL      string `name:"api-url" help:"The node-facing control plane URL the agent should use (\"\" stops checking)."`
	TerminalURL string `name:"terminal-url" help:"The node-facing terminal URL the agent should use (\"\" stops checking)."`
}

// Run implements the command.
func (c *HostProfileCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var h api.Host
	req := api.HostProfileRequest{APIURL: c.APIURL, TerminalURL: c.TerminalURL}
	if err := cl.call(ctx, http.MethodPost, "/api/v1/hosts/"+url.PathEscape(c.HostID)+"/profile", nil, req, &h); err != nil {
		return err
	}
	return printHost(env, c.JSON, h)
}

// HostSlotsCmd lists approved slots.
type HostSlotsCmd struct {
	APIFlags
	HostID string `arg:"" name:"host-id"`
}

// Run implements the command.
func (c *HostSlotsCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var slots []api.Slot
	if err := cl.call(ctx, http.MethodGet, "/api/v1/hosts/"+url.PathEscape(c.HostID)+"/slots", nil, nil, &slots); err != nil {
		return err
	}
	return printSlots(env, c.JSON, slots)
}

func printSlots(env *Env, asJSON bool, slots []api.Slot) error {
	if asJSON {
		return printJSON(env.Stdout, slots)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "SLOT\tINDEX\tAPPROVED BY\tFROM TASK\tSPEC")
	for _, s := range slots {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", s.SlotID, s.Index, s.ApprovedBy, s.SourceTask, s.Spec)
	}
	return tw.Flush()
}

// HostApproveCmd approves candidate slots.
type HostApproveCmd struct {
	APIFlags
	HostID string `arg:"" name:"host-id"`
	Task   string `name:"task" required:"" help:"The succeeded slice.topology_discover task."`
	Slot   []int  `name:"slot" help:"Candidate slot index (repeatable)."`
	All    bool   `name:"all" help:"Approve every candidate slot."`
}

// Run implements the command.
func (c *HostApproveCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var slots []api.Slot
	req := api.ApproveSlotsRequest{TaskID: c.Task, SlotIndexes: c.Slot, All: c.All}
	if err := cl.call(ctx, http.MethodPost, "/api/v1/hosts/"+url.PathEscape(c.HostID)+"/slots", nil, req, &slots); err != nil {
		return err
	}
	return printSlots(env, c.JSON, slots)
}

// PlaceCmd asks the placement check.
type PlaceCmd struct {
	APIFlags
	Node      string            `name:"node" help:"Only this host."`
	Label     map[string]string `name:"label" help:"Required labels, key=value (repeatable)."`
	VCPUs     int               `name:"vcpus"`
	MemoryMiB int               `name:"memory-mib"`
	DiskGiB   int               `name:"disk-gib"`
	GPUs      int               `name:"gpus"`
}

// Run implements the command.
func (c *PlaceCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	req := api.PlacementRequest{NodeID: c.Node, Labels: c.Label,
		Resources: api.Capacity{VCPUs: c.VCPUs, MemoryMiB: c.MemoryMiB, DiskGiB: c.DiskGiB, GPUs: c.GPUs}}
	var res api.PlacementResponse
	if err := cl.call(ctx, http.MethodPost, "/api/v1/placements/check", nil, req, &res); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, res)
	}
	fmt.Fprintf(env.Stdout, "fits on %s (free %d vCPU, %d MiB, %d GiB disk, %d GPU)\n", res.NodeID,
		res.Free.VCPUs, res.Free.MemoryMiB, res.Free.DiskGiB, res.Free.GPUs)
	return nil
}

// HostsListCmd lists hosts.
type HostsListCmd struct{ APIFlags }

// Run implements the command.
func (c *HostsListCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var hosts []api.Host
	if err := cl.call(ctx, http.MethodGet, "/api/v1/hosts", nil, nil, &hosts); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, hosts)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "HOST\tOS\tSTATUS\tENABLED\tSCHEDULABLE\tACCEL\tLAST SEEN")
	for _, h := range hosts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%t\t%s\t%s\n", h.ID, h.OSFamily, h.Status, h.Enabled, h.Schedulable,
			dash(h.SelectedAccel), ago(h.LastSeenAt))
	}
	return tw.Flush()
}

// HostsCreateCmd creates a host.
type HostsCreateCmd struct {
	APIFlags
	HostID      string            `arg:"" name:"host-id" help:"Host id (lowercase letters, digits, '-', '.', '_')."`
	OSFamily    string            `name:"os-family" default:"linux" enum:"linux,dragonflybsd,windows,darwin" help:"OS family."`
	Labels      map[string]string `name:"label" help:"Labels, key=value (repeatable)."`
	TokenTTL    time.Duration     `name:"token-ttl" help:"Bootstrap token lifetime (default 24h)."`
	APIURL      string            `name:"api-url" help:"Environment profile: the node-facing control plane URL the agent should use."`
	TerminalURL string            `name:"terminal-url" help:"Environment profile: the node-facing terminal URL the agent should use."`
}

// Run implements the command.
func (c *HostsCreateCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var bt api.BootstrapToken
	req := api.CreateHostRequest{HostID: c.HostID, OSFamily: c.OSFamily, Labels: c.Labels, TokenTTL: api.Duration(c.TokenTTL),
		APIURL: c.APIURL, TerminalURL: c.TerminalURL}
	if err := cl.call(ctx, http.MethodPost, "/api/v1/hosts", nil, req, &bt); err != nil {
		return err
	}
	return printBootstrap(env, c.JSON, bt, c.OSFamily)
}

func printBootstrap(env *Env, asJSON bool, bt api.BootstrapToken, osFamily string) error {
	if asJSON {
		return printJSON(env.Stdout, bt)
	}
	fmt.Fprintf(env.Stdout, "Host %s: bootstrap token (shown once, expires %s):\n\n", bt.HostID, bt.ExpiresAt.Format(time.RFC3339))
	fmt.Fprintf(env.Stdout, "  NODE_AGENT_HOST_ID=%s\n  NODE_AGENT_BOOTSTRAP_TOKEN=%s\n  NODE_AGENT_CONTROL_PLANE_URL=%s\n  NODE_AGENT_CA_HASH=%s\n",
		bt.HostID, bt.Token, bt.NodeURL, bt.CAHash)
	if osFamily != "" {
		fmt.Fprintf(env.Stdout, "  NODE_AGENT_OS_FAMILY=%s\n", osFamily)
	}
	fmt.Fprintln(env.Stdout, "\nPut these in the agent's env file and start drover-agent.")
	return nil
}

// HostIDCmd is a command that acts on one host.
type HostIDCmd struct {
	APIFlags
	HostID string `arg:"" name:"host-id"`
}

// Run implements show, enable, disable, rotate-token, drain and undrain.
func (c *HostIDCmd) Run(ctx context.Context, env *Env, kctx *kong.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	// kctx.Command() is e.g. "hosts rotate-token <host-id>".
	verb := strings.Fields(kctx.Command())[1]
	path := "/api/v1/hosts/" + url.PathEscape(c.HostID)
	switch verb {
	case "show":
		var h api.Host
		if err := cl.call(ctx, http.MethodGet, path, nil, nil, &h); err != nil {
			return err
		}
		return printHost(env, c.JSON, h)
	case "rotate-token":
		var bt api.BootstrapToken
		if err := cl.call(ctx, http.MethodPost, path+"/rotate-token", nil, nil, &bt); err != nil {
			return err
		}
		return printBootstrap(env, c.JSON, bt, "")
	default:
		var h api.Host
		if err := cl.call(ctx, http.MethodPost, path+"/"+verb, nil, nil, &h); err != nil {
			return err
		}
		return printHost(env, c.JSON, h)
	}
}

// HostRevokeCmd revokes a host after confirmation.
type HostRevokeCmd struct {
	APIFlags
	Yes
	HostID string `arg:"" name:"host-id"`
}

// Run implements the command.
func (c *HostRevokeCmd) Run(ctx context.Context, env *Env) error {
	if err := c.confirm(env, fmt.Sprintf("Revoking host %s", c.HostID), c.HostID); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	var h api.Host
	if err := cl.call(ctx, http.MethodPost, "/api/v1/hosts/"+url.PathEscape(c.HostID)+"/revoke", nil, nil, &h); err != nil {
		return err
	}
	return printHost(env, c.JSON, h)
}

func printHost(env *Env, asJSON bool, h api.Host) error {
	if asJSON {
		return printJSON(env.Stdout, h)
	}
	tw := table(env.Stdout)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("host_id", h.ID)
	row("os_family", h.OSFamily)
	row("selected_accel", dash(h.SelectedAccel))
	row("status", h.Status)
	if h.StatusReason != "" {
		row("status_reason", h.StatusReason)
	}
	row("enabled", h.Enabled)
	row("revoked", h.Revoked)
	row("schedulable", h.Schedulable)
	row("draining", h.Draining)
	row("enrolled", h.Enrolled)
	row("hostname", dash(h.Hostname))
	row("agent_version", dash(h.AgentVersion))
	row("last_seen", ago(h.LastSeenAt))
	if h.CertNotAfter != nil {
		row("cert_not_after", h.CertNotAfter.Format(time.RFC3339))
	}
	if c := h.Capabilities; c != nil {
		if c.AccelError != "" {
			row("accel_error", c.AccelError)
		}
		row("accelerators", dash(strings.Join(c.Accelerators, ",")))
		row("kernel", dash(c.KernelVersion))
		row("arch", c.Arch)
		row("cpu_cores", c.CPUCores)
		row("ram_total_mb", c.RAMTotalMB)
		row("gpu_count", c.GPUCount)
	}
	if c := h.Capacity; c != nil {
		for _, r := range []struct {
			name string
			c    api.Capacity
		}{{"capacity total", c.Total}, {"capacity reserved", c.Reserved}, {"capacity allocated", c.Allocated}, {"capacity free", c.Free}} {
			row(r.name, fmt.Sprintf("%d vCPU, %d MiB, %d GiB disk, %d GPU", r.c.VCPUs, r.c.MemoryMiB, r.c.DiskGiB, r.c.GPUs))
		}
	}
	for k, v := range h.Labels {
		row("label "+k, v)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printHostDiagnostics(env, h)
}

// printHostDiagnostics prints the host's last failure, last successful
// preflight and environment profile (a table of their own).
func printHostDiagnostics(env *Env, h api.Host) error {
	tw := table(env.Stdout)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	if h.LastFailureSignal != "" {
		row("last_failure", h.LastFailureSignal)
		if h.LastFailureDetail != "" {
			row("last_failure_detail", h.LastFailureDetail)
		}
		row("last_failure_correlation_id", dash(h.LastFailureCorrelationID))
		if h.LastFailureAt != nil {
			row("last_failure_at", h.LastFailureAt.Format(time.RFC3339))
		}
	}
	if h.LastSuccessfulPreflightAt != nil {
		row("last_successful_preflight", h.LastSuccessfulPreflightAt.Format(time.RFC3339))
	} else {
		row("last_successful_preflight", "-")
	}
	p := h.Profile
	row("profile api_url", dash(p.APIURL)+" (agent: "+dash(p.ReportedAPIURL)+")")
	row("profile terminal_url", dash(p.TerminalURL)+" (agent: "+dash(p.ReportedTerminalURL)+")")
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ago(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return time.Since(*t).Round(time.Second).String() + " ago"
}
