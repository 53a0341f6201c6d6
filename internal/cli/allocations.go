package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/drover-dev/drover/internal/wire/api"
)

// AllocationsCmd groups allocation commands.
type AllocationsCmd struct {
	List     AllocListCmd     `cmd:"" help:"List allocations."`
	Create   AllocCreateCmd   `cmd:"" help:"Bind a user to a host (provisions the OS user), to an instance (its serial console), or to a slice VM (--slots)."`
	Show     AllocIDCmd       `cmd:"" help:"Show one allocation."`
	Release  AllocIDCmd       `cmd:"" help:"Release an allocation: close its terminals and remove its OS user."`
	Sessions AllocIDCmd       `cmd:"" help:"List an allocation's terminal sessions with their readiness hops."`
	Token    AllocTokenCmd    `cmd:"" name:"terminal-token" help:"Mint a single-use terminal token (60 s) for an allocation."`
	Record   AllocSessionsCmd `cmd:"" name:"recording" help:"Print a terminal session's asciicast v2 recording."`
}

// AllocListCmd lists allocations.
type AllocListCmd struct {
	APIFlags
	Host  string `name:"host" help:"Only this host's allocations."`
	State string `name:"state" help:"Only allocations in this state."`
}

// Run implements the command.
func (c *AllocListCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	q := url.Values{}
	if c.Host != "" {
		q.Set("host_id", c.Host)
	}
	if c.State != "" {
		q.Set("state", c.State)
	}
	var as []api.Allocation
	if err := cl.call(ctx, http.MethodGet, "/api/v1/allocations", q, nil, &as); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, as)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "ID\tKIND\tUSER\tHOST\tINSTANCE\tSTATE\tREASON")
	for _, a := range as {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Kind, a.Username, a.HostID, orNone(a.InstanceID),
			a.State, a.StateReason)
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// AllocCreateCmd creates an allocation.
type AllocCreateCmd struct {
	APIFlags
	User       string   `name:"user" required:"" help:"OS user name (host) or console user (instance); not root."`
	Host       string   `name:"host" help:"Host for a bare-metal allocation."`
	Instance   string   `name:"instance" help:"Instance (id or name) whose serial console the allocation opens."`
	SSHKey     []string `name:"ssh-key" help:"Authorized SSH public key (repeatable)."`
	SSHKeyFile []string `name:"ssh-key-file" type:"existingfile" help:"File of authorized SSH public keys, one per line (repeatable)."`
	Shell      string   `name:"shell" help:"Login shell (default /bin/bash when present; for a slice, in the guest)."`
	Sudo       bool     `name:"sudo" help:"Grant passwordless sudo (for a slice, in the guest, which must have sudo)."`
	SliceFlags
}

// Run implements the command.
func (c *AllocCreateCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	sr, err := c.SliceFlags.request()
	if err != nil {
		return err
	}
	req := api.CreateAllocationRequest{Username: c.User, HostID: c.Host, InstanceID: c.Instance,
		SSHAuthorizedKeys: c.SSHKey, Shell: c.Shell, Sudo: c.Sudo, SliceRequest: sr}
	for _, f := range c.SSHKeyFile {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("--ssh-key-file: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				req.SSHAuthorizedKeys = append(req.SSHAuthorizedKeys, line)
			}
		}
	}
	var a api.Allocation
	if err := cl.call(ctx, http.MethodPost, "/api/v1/allocations", nil, req, &a); err != nil {
		return err
	}
	if c.Wait {
		if a, err = waitSlice(ctx, env, cl, a, c.JSON); err != nil {
			return err
		}
	}
	return printAllocation(env, c.JSON, a)
}

func printAllocation(env *Env, asJSON bool, a api.Allocation) error {
	if asJSON {
		return printJSON(env.Stdout, a)
	}
	tw := table(env.Stdout)
	fmt.Fprintf(tw, "id\t%s\nkind\t%s\nuser\t%s\nhost\t%s\ninstance\t%s\nstate\t%s\n", a.ID, a.Kind, a.Username,
		a.HostID, orNone(a.InstanceID), a.State)
	if a.StateReason != "" {
		fmt.Fprintf(tw, "reason\t%s\n", a.StateReason)
	}
	if a.ProvisionTaskID != "" {
		fmt.Fprintf(tw, "provision task\t%s\n", a.ProvisionTaskID)
	}
	if a.ReleaseTaskID != "" {
		fmt.Fprintf(tw, "release task\t%s\n", a.ReleaseTaskID)
	}
	fmt.Fprintf(tw, "created\t%s by %s\n", a.CreatedAt.Format(time.RFC3339), a.CreatedBy)
	printWorkflow(tw, a.Workflow)
	return tw.Flush()
}

// AllocIDCmd takes one allocation id.
type AllocIDCmd struct {
	APIFlags
	ID string `arg:"" name:"allocation-id"`
}

// Run implements show, release and sessions.
func (c *AllocIDCmd) Run(ctx context.Context, env *Env, kctx *kong.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	path := "/api/v1/allocations/" + url.PathEscape(c.ID)
	switch strings.Fields(kctx.Command())[1] { // e.g. "allocations release <allocation-id>"
	case "release":
		var a api.Allocation
		if err := cl.call(ctx, http.MethodDelete, path, nil, nil, &a); err != nil {
			return err
		}
		return printAllocation(env, c.JSON, a)
	case "sessions":
		var ss []api.TerminalSession
		if err := cl.call(ctx, http.MethodGet, path+"/sessions", nil, nil, &ss); err != nil {
			return err
		}
		if c.JSON {
			return printJSON(env.Stdout, ss)
		}
		tw := table(env.Stdout)
		fmt.Fprintln(tw, "SESSION\tSTATE\tERROR\tCLOSE\tEXIT\tCREATED\tHOPS")
		for _, s := range ss {
			exit := "-"
			if s.ExitCode != nil {
				exit = fmt.Sprint(*s.ExitCode)
			}
			var hops []string
			for _, h := range s.States {
				hops = append(hops, fmt.Sprintf("%s@%dms", h.State, h.ElapsedMS))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.State, orNone(s.ErrorCode), orNone(s.CloseReason),
				exit, s.CreatedAt.Format(time.RFC3339), strings.Join(hops, " "))
		}
		return tw.Flush()
	}
	var a api.Allocation
	if err := cl.call(ctx, http.MethodGet, path, nil, nil, &a); err != nil {
		return err
	}
	return printAllocation(env, c.JSON, a)
}

// AllocTokenCmd mints a terminal token.
type AllocTokenCmd struct {
	APIFlags
	ID   string `arg:"" name:"allocation-id"`
	Cols int    `name:"cols" default:"80"`
	Rows int    `name:"rows" default:"24"`
}

// Run implements the command.
func (c *AllocTokenCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var t api.TerminalToken
	if err := cl.call(ctx, http.MethodPost, "/api/v1/allocations/"+url.PathEscape(c.ID)+"/terminal-token", nil,
		api.TerminalTokenRequest{Cols: c.Cols, Rows: c.Rows}, &t); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, t)
	}
	tw := table(env.Stdout)
	fmt.Fprintf(tw, "session\t%s\nnode\t%s\nexpires\t%s\nurl\t%s\nsubprotocols\t%s, drover.token.<token>\ntoken\t%s\n",
		t.SessionID, t.NodeID, t.ExpiresAt.Format(time.RFC3339), t.URL, t.Subprotocol, t.Token)
	return tw.Flush()
}

// AllocSessionsCmd prints a session's recording.
type AllocSessionsCmd struct {
	APIFlags
	SessionID string `arg:"" name:"session-id"`
}

// Run implements the command.
func (c *AllocSessionsCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var cast []byte
	if err := cl.call(ctx, http.MethodGet, "/api/v1/terminal-sessions/"+url.PathEscape(c.SessionID)+"/recording", nil, nil, &cast); err != nil {
		return err
	}
	_, err = env.Stdout.Write(cast)
	return err
}
