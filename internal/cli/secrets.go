package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// SecretsCmd groups workload secret commands.
type SecretsCmd struct {
	Set    SecretsSetCmd    `cmd:"" help:"Set or replace a workload secret's value (from a file or stdin; never from the command line)."`
	List   SecretsListCmd   `cmd:"" help:"List workload secrets: names, versions and timestamps (never values)."`
	Delete SecretsDeleteCmd `cmd:"" help:"Delete a workload secret (irreversible; asks, or --yes)."`
}

// SecretsSetCmd sets a secret. The value is read from a file or stdin so
// that it never appears in a shell history or a process listing; it is
// sent as base64 (any bytes) and never printed.
type SecretsSetCmd struct {
	APIFlags
	Name      string `arg:"" help:"Secret name: ^[a-z0-9][a-z0-9_.-]{0,62}$ (what an instance spec names in secrets)."`
	FromFile  string `name:"from-file" placeholder:"FILE" help:"Read the value from FILE (all of it, bytes as they are)." xor:"source"`
	FromStdin bool   `name:"from-stdin" help:"Read the value from stdin until EOF." xor:"source"`
}

// Run implements the command.
func (c *SecretsSetCmd) Run(ctx context.Context, env *Env) error {
	var r io.Reader
	switch {
	case c.FromFile != "":
		f, err := os.Open(c.FromFile)
		if err != nil {
			return fmt.Errorf("secret value: %w", err)
		}
		defer f.Close()
		r = f
	case c.FromStdin:
		if env.Stdin == nil {
			return errors.New("--from-stdin: no stdin")
		}
		r = env.Stdin
	default:
		return errors.New("give the value with --from-file FILE or --from-stdin")
	}
	v, err := io.ReadAll(io.LimitReader(r, api.MaxSecretValue+1))
	if err != nil {
		return fmt.Errorf("read secret value: %w", err)
	}
	if len(v) > api.MaxSecretValue {
		return fmt.Errorf("secret value larger than %d bytes", api.MaxSecretValue)
	}
	b64 := base64.StdEncoding.EncodeToString(v)
	clear(v)
	cl, err := c.client()
	if err != nil {
		return err
	}
	var s api.Secret
	if err := cl.call(ctx, http.MethodPut, "/api/v1/secrets/"+url.PathEscape(c.Name), nil,
		api.SetSecretRequest{ValueBase64: &b64}, &s); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, s)
	}
	fmt.Fprintf(env.Stdout, "secret %s set (version %d)\n", s.Name, s.Version)
	return nil
}

// SecretsListCmd lists secrets.
type SecretsListCmd struct{ APIFlags }

// Run implements the command.
func (c *SecretsListCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var list []api.Secret
	if err := cl.call(ctx, http.MethodGet, "/api/v1/secrets", nil, nil, &list); err != nil {
		return err
	}
	if c.JSON {
		return printJSON(env.Stdout, list)
	}
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "NAME\tVERSION\tUPDATED\tUPDATED BY\tCREATED\tCREATED BY")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", s.Name, s.Version, s.UpdatedAt.Local().Format(time.DateTime),
			s.UpdatedBy, s.CreatedAt.Local().Format(time.DateTime), s.CreatedBy)
	}
	return tw.Flush()
}

// SecretsDeleteCmd deletes a secret.
type SecretsDeleteCmd struct {
	APIFlags
	Yes
	Name string `arg:""`
}

// Run implements the command.
func (c *SecretsDeleteCmd) Run(ctx context.Context, env *Env) error {
	if err := c.confirm(env, fmt.Sprintf("Deleting secret %s", c.Name), c.Name); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	if err := cl.call(ctx, http.MethodDelete, "/api/v1/secrets/"+url.PathEscape(c.Name), nil, nil, nil); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "deleted secret %s\n", c.Name)
	return nil
}
