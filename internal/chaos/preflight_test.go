package chaos

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	wirepf "github.com/drover-dev/drover/internal/wire/preflight"
)

// pfRun is one `drover preflight --json` run.
type pfRun struct {
	rep           wirepf.Report
	start, finish time.Time
	stderr        string
}

// preflight runs the real drover preflight with --node-local (the agent's
// environment) plus args; --allocation-id and --run-ws-smoke when the
// cluster has an allocation.
func (c *cluster) preflight(agentBin string, args ...string) pfRun {
	c.t.Helper()
	return c.runPreflight(append([]string{"--node-local", "--agent-binary", agentBin}, args...))
}

// operatorPreflight is drover preflight without node-side hops (what an
// operator without a path to the node runs).
func (c *cluster) operatorPreflight() pfRun {
	c.t.Helper()
	return c.runPreflight(nil)
}

func (c *cluster) runPreflight(args []string) pfRun {
	c.t.Helper()
	full := []string{"preflight", "--json", "--api-base", c.opURL, "--token", c.token, "--node-id", c.hostID,
		"--timeout", hopTimeout.String()}
	if c.allocID != "" {
		full = append(full, "--allocation-id", c.allocID, "--run-ws-smoke")
	}
	full = append(full, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bins.drover, full...)
	cmd.Env = c.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	r := pfRun{start: time.Now()}
	err := cmd.Run()
	r.finish, r.stderr = time.Now(), stderr.String()
	if jerr := json.Unmarshal(stdout.Bytes(), &r.rep); jerr != nil {
		c.t.Fatalf("drover preflight: %v / %v\nstdout: %s\nstderr: %s", err, jerr, stdout.String(), stderr.String())
	}
	if r.rep.Classification.OK != (err == nil) {
		c.t.Errorf("drover preflight exit %v with classification ok=%v", err, r.rep.Classification.OK)
	}
	return r
}

// hopDetail is the detail of the report's failed hop.
func (r pfRun) hopDetail() string {
	for _, h := range r.rep.Hops {
		if h.Hop == r.rep.Classification.Hop {
			return h.Detail
		}
	}
	return ""
}

// evidence fetches the evidence bundle and the audit records of cid and
// checks both carry it: the bundle's manifest and stored preflight run, and
// at least one audit record (preflight.run). It is safe to call from
// another goroutine (it returns its findings instead of failing the test):
// the bundle waits for the agent's diag.collect, which a broken agent never
// answers, so the matrix fetches it during the repair.
func (c *cluster) evidence(cid string) (summary string, problems []string) {
	get := func(path string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.opURL+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: HTTP %d: %s", path, resp.StatusCode, b)
		}
		return b, err
	}
	raw, err := get("/api/v1/evidence/" + url.PathEscape(cid))
	if err != nil {
		return "", []string{"evidence: " + err.Error()}
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return "", []string{"evidence: " + err.Error()}
	}
	tr := tar.NewReader(zr)
	var names []string
	var manifest api.EvidenceManifest
	runHasCID := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", []string{"evidence: " + err.Error()}
		}
		b, _ := io.ReadAll(tr)
		names = append(names, h.Name)
		switch {
		case strings.HasSuffix(h.Name, "manifest.json"):
			if err := json.Unmarshal(b, &manifest); err != nil {
				problems = append(problems, "manifest: "+err.Error())
			}
		case strings.Contains(h.Name, "preflight"):
			runHasCID = runHasCID || bytes.Contains(b, []byte(cid))
		}
	}
	if manifest.CorrelationID != cid || !runHasCID {
		problems = append(problems, fmt.Sprintf("evidence bundle of %s: manifest %q, stored run with the id: %v (files %v)",
			cid, manifest.CorrelationID, runHasCID, names))
	}
	raw, err = get("/api/v1/audit?correlation_id=" + url.QueryEscape(cid))
	if err != nil {
		return "", append(problems, "audit: "+err.Error())
	}
	var audit []api.AuditEvent
	if err := json.Unmarshal(raw, &audit); err != nil {
		return "", append(problems, "audit: "+err.Error())
	}
	var actions []string
	for _, a := range audit {
		if a.CorrelationID != cid {
			problems = append(problems, fmt.Sprintf("audit record %+v under another correlation id", a))
		}
		actions = append(actions, a.Action)
	}
	if len(audit) == 0 {
		problems = append(problems, "no audit record under "+cid)
	}
	return fmt.Sprintf("bundle %v; audit %v", names, actions), problems
}
