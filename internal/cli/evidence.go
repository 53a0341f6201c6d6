package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"github.com/drover-dev/drover/internal/wire/api"
)

// EvidenceCmd downloads the evidence bundle of a correlation id.
type EvidenceCmd struct {
	APIFlags
	CorrelationID string `arg:"" name:"correlation-id" help:"The correlation id (from an error, a host's last failure or a preflight run)."`
	Output        string `name:"output" short:"o" help:"Where to write the tar.gz (default evidence-<correlation-id>.tar.gz)."`
}

// Run implements the command: it writes the bundle and prints its path and
// contents (with what could not be collected).
func (c *EvidenceCmd) Run(ctx context.Context, env *Env) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	var raw []byte
	if err := cl.call(ctx, http.MethodGet, "/api/v1/evidence/"+url.PathEscape(c.CorrelationID), nil, nil, &raw); err != nil {
		return err
	}
	out := c.Output
	if out == "" {
		out = "evidence-" + c.CorrelationID + ".tar.gz"
	}
	if err := os.WriteFile(out, raw, 0o600); err != nil {
		return err
	}
	m, err := readManifest(raw)
	if err != nil {
		return fmt.Errorf("%s: %v", out, err)
	}
	if c.JSON {
		return printJSON(env.Stdout, struct {
			Path     string               `json:"path"`
			Manifest api.EvidenceManifest `json:"manifest"`
		}{out, m})
	}
	fmt.Fprintf(env.Stdout, "wrote %s (%d bytes) for correlation id %s\n", out, len(raw), m.CorrelationID)
	tw := table(env.Stdout)
	fmt.Fprintln(tw, "FILE\tBYTES\tNOTE")
	for _, f := range m.Files {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", f.Name, f.Bytes, dash(m.Missing[f.Name]))
	}
	return tw.Flush()
}

// readManifest reads manifest.json from a bundle.
func readManifest(bundle []byte) (api.EvidenceManifest, error) {
	var m api.EvidenceManifest
	gz, err := gzip.NewReader(bytes.NewReader(bundle))
	if err != nil {
		return m, err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m, errors.New("no manifest.json in the bundle")
		} else if err != nil {
			return m, err
		}
		if h.Name == "manifest.json" {
			b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
			if err != nil {
				return m, err
			}
			return m, json.Unmarshal(b, &m)
		}
	}
}
