package agent

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	noderuntime "github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/preflight"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// splitArgs separates a subcommand's own flags (as defined on fs) from
// the agent's configuration flags, which LoadConfig reads.
func splitArgs(fs *flag.FlagSet, args []string) (own, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		fl := fs.Lookup(name)
		if !strings.HasPrefix(a, "-") || fl == nil {
			rest = append(rest, a)
			continue
		}
		own = append(own, a)
		if bf, ok := fl.Value.(interface{ IsBoolFlag() bool }); (!ok || !bf.IsBoolFlag()) && !hasValue && i+1 < len(args) {
			i++
			own = append(own, args[i])
		}
	}
	return own, rest
}

func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			return true
		}
	}
	return false
}

// PreflightCommand is `drover-agent preflight`: it runs the node-side hops
// and prints a preflight.NodeReport (JSON with --json, else a table) on
// stdout, progress on stderr. It returns the exit code: 0 when every hop
// passed, 1 on a failure, 2 on a usage or configuration error.
func PreflightCommand(ctx context.Context, args []string, getenv func(string) string, runtimes noderuntime.Registry, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drover-agent preflight", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	var o PreflightOptions
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Second, "time limit of each hop")
	fs.StringVar(&o.RuntimeAPIURL, "runtime-api-url", "", "control plane node API URL to test (default NODE_AGENT_CONTROL_PLANE_URL)")
	fs.StringVar(&o.RuntimeResolveAddress, "runtime-resolve-address", "", "dial this address (IP or IP:port) instead of resolving the runtime API host")
	fs.StringVar(&o.TerminalURL, "terminal-url", "", "node-facing terminal URL to test (default NODE_AGENT_TERMINAL_URL)")
	fs.StringVar(&o.TerminalResolveAddress, "terminal-resolve-address", "", "dial this address instead of resolving the terminal host")
	if wantsHelp(args) {
		var b strings.Builder
		b.WriteString("Usage: drover-agent preflight [flags] [agent configuration flags, e.g. -config /etc/drover/agent.env]\n\n" +
			"Runs the node-side preflight hops (node_readiness, node_runtime_api_reachability,\n" +
			"node_terminal_reachability) with the node's certificate; exit code 1 on any failure.\n\nFlags:\n")
		fs.VisitAll(func(f *flag.Flag) { fmt.Fprintf(&b, "  --%s\t%s\n", f.Name, f.Usage) })
		fmt.Fprint(stdout, b.String())
		return 0
	}
	own, rest := splitArgs(fs, args)
	if err := fs.Parse(own); err != nil {
		fmt.Fprintln(stderr, "drover-agent preflight:", err)
		return 2
	}
	cfg, err := LoadConfig(rest, getenv, runtimes)
	if err != nil {
		fmt.Fprintln(stderr, "drover-agent preflight: configuration:", err)
		return 2
	}
	o.Progress = stderr
	rep := Preflight(ctx, cfg, o)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printNodeReport(stdout, rep)
	}
	for _, h := range rep.Hops {
		if h.Status == preflight.Failed {
			return 1
		}
	}
	return 0
}

func printNodeReport(w io.Writer, rep preflight.NodeReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "node %s  drover-agent %s %s/%s\n", rep.NodeID, rep.AgentVersion, rep.GOOS, rep.GOARCH)
	fmt.Fprintln(tw, "HOP\tSTATUS\tMS\tSIGNAL\tDETAIL")
	for _, h := range rep.Hops {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", h.Hop, h.Status, h.DurationMS, h.Signal, h.Detail)
	}
	_ = tw.Flush()
	for _, h := range rep.Hops {
		if h.Status == preflight.Failed {
			fmt.Fprintf(w, "\nfirst failure: %s (%s); owner: %s\nrecovery: %s\n", h.Hop, h.Signal, h.Owner, h.Recovery)
			return
		}
	}
}

// StatusCommand is `drover-agent status`: it asks the running agent's local
// API (NODE_AGENT_LISTEN) for its status document and prints a summary,
// or the document with --json. Exit code 0 when ok, 1 on a problem or when
// the agent does not answer, 2 on a usage error.
func StatusCommand(ctx context.Context, args []string, getenv func(string) string, runtimes noderuntime.Registry, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drover-agent status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print the status document as JSON")
	if wantsHelp(args) {
		fmt.Fprint(stdout, "Usage: drover-agent status [--json] [agent configuration flags, e.g. -listen 127.0.0.1:9000]\n\n"+
			"Prints the running agent's status (current signal, detail, since, spooled results,\n"+
			"disk usage, last heartbeat) from its local API; exit code 1 when there is a problem.\n")
		return 0
	}
	own, rest := splitArgs(fs, args)
	if err := fs.Parse(own); err != nil {
		fmt.Fprintln(stderr, "drover-agent status:", err)
		return 2
	}
	listen := "127.0.0.1:9000"
	if cfg, err := LoadConfig(rest, getenv, runtimes); err == nil {
		listen = cfg.ListenAddr
	} else if v := getenv("NODE_AGENT_LISTEN"); v != "" {
		listen = v
	}
	if h, port, ok := strings.Cut(listen, ":"); ok && (h == "" || h == "0.0.0.0") {
		listen = "127.0.0.1:" + port
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+listen+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "drover-agent status: the agent's local API at %s does not answer (%v): is drover-agent running? (signal %s)\n", listen, err, signal.ProcessDown)
		return 1
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var st Status
	if err == nil {
		err = json.Unmarshal(raw, &st)
	}
	if err != nil {
		fmt.Fprintf(stderr, "drover-agent status: unreadable answer from %s: %v\n", listen, err)
		return 1
	}
	if *asJSON {
		_, _ = stdout.Write(raw)
	} else {
		printStatus(stdout, st)
	}
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}

func printStatus(w io.Writer, st Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("status", st.Status)
	row("node", st.NodeID)
	row("version", st.Version)
	row("control plane", st.ControlPlaneURL)
	if st.Signal != "" {
		row("signal", string(st.Signal))
		row("detail", st.Detail)
		if st.Since != nil {
			row("since", st.Since.Format(time.RFC3339))
		}
		if st.CorrelationID != "" {
			row("correlation id", st.CorrelationID)
		}
	}
	row("spooled results", fmt.Sprint(st.SpooledResults))
	row("disk used", fmt.Sprintf("%.1f%% of %s (pressure at %d%%)", st.DiskUsedPercent, st.DiskPath, st.DiskPressurePercent))
	if st.LastHeartbeatAt != nil {
		row("last heartbeat", st.LastHeartbeatAt.Format(time.RFC3339))
	} else {
		row("last heartbeat", "never")
	}
	_ = tw.Flush()
}
