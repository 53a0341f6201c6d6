package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// logsTrailer is the API's end-of-stream trailer (logsgw.TrailerEnd).
const logsTrailer = "X-Drover-Logs-End"

// InstancesLogsCmd streams an instance's logs.
type InstancesLogsCmd struct {
	APIFlags
	Ref    string `arg:"" name:"instance" help:"Instance id or name."`
	Follow bool   `name:"follow" short:"f" help:"Keep streaming new lines until interrupted (Ctrl-C)."`
	Since  string `name:"since" help:"Only lines since this RFC 3339 time or this long ago (10m, 2h). For VM serial logs, which carry no line times, by the log file's modification time."`
	Tail   int    `name:"tail" help:"Only the last N lines (0: all)."`
}

// Run implements the command: the log goes to stdout as it arrives; an
// error (before or during the stream) carries its code and correlation id.
func (c *InstancesLogsCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	q := url.Values{}
	if c.Follow {
		q.Set("follow", "true")
	}
	if c.Since != "" {
		q.Set("since", c.Since)
	}
	if c.Tail != 0 {
		q.Set("tail", strconv.Itoa(c.Tail))
	}
	u := cl.base + "/api/v1/instances/" + url.PathEscape(c.Ref) + "/logs?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cl.token)
	req.Header.Set("Accept", "text/plain")
	// A stream has no overall timeout; only its start is bounded.
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: 90 * time.Second}}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("operator API %s unreachable: %w", cl.base, err)
	}
	defer resp.Body.Close()
	cid := resp.Header.Get(api.HeaderCorrelationID)
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var eb api.ErrorBody
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			return fmt.Errorf("logs of %s: HTTP %d: %s (correlation_id %s)", c.Ref, resp.StatusCode,
				strings.TrimSpace(string(raw)), dash(cid))
		}
		msg := fmt.Sprintf("%s (%s, HTTP %d, correlation_id %s)", eb.Error.Message, eb.Error.Code, resp.StatusCode,
			dash(eb.Error.CorrelationID))
		for _, f := range eb.Error.Fields {
			msg += fmt.Sprintf("\n  %s: %s", f.Field, f.Message)
		}
		return errors.New(msg)
	}
	if _, err := io.Copy(env.Stdout, resp.Body); err != nil {
		if ctx.Err() != nil {
			return nil // interrupted: the stream ends on the node too
		}
		return fmt.Errorf("logs of %s: the stream broke: %w (correlation_id %s)", c.Ref, err, dash(cid))
	}
	end := resp.Trailer.Get(logsTrailer)
	reason, detail, _ := strings.Cut(end, " ")
	switch reason {
	case "eof", "":
		return nil
	case "max_lifetime":
		fmt.Fprintf(env.Stderr, "drover: the log stream reached its maximum lifetime; run again with --since to go on\n")
		return nil
	}
	return fmt.Errorf("logs of %s ended: %s %s (correlation_id %s)", c.Ref, reason, detail, dash(cid))
}
