package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// HealthcheckCmd asks a control plane's /healthz and exits 0 on 200. The
// container image runs it as its HEALTHCHECK: a scratch image has no curl.
type HealthcheckCmd struct {
	URL     string        `name:"url" env:"DROVER_HEALTHCHECK_URL" default:"http://127.0.0.1:8080/healthz" help:"The health endpoint to ask."`
	Timeout time.Duration `name:"timeout" default:"3s" help:"Give up after this long."`
}

// Run implements the command.
func (c *HealthcheckCmd) Run(ctx context.Context, env *Env) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s: %s", c.URL, resp.Status, body)
	}
	fmt.Fprintf(env.Stdout, "%s: %s\n", c.URL, resp.Status)
	return nil
}
