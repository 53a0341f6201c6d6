package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// APIFlags are the flags every operator command shares.
type APIFlags struct {
	API   string `name:"api" env:"DROVER_API" default:"http://127.0.0.1:8080" help:"Operator API URL."`
	Token string `name:"token" env:"DROVER_TOKEN" help:"Operator token (default: ./.drover/operator.token written by 'drover dev')."`
	JSON  bool   `name:"json" help:"Print JSON instead of tables."`
}

// operatorClient calls the operator API.
type operatorClient struct {
	base  string
	token string
	http  *http.Client
}

func (f APIFlags) client() (*operatorClient, error) {
	tok, err := f.token()
	if err != nil {
		return nil, err
	}
	return &operatorClient{base: strings.TrimRight(f.API, "/"), token: tok, http: &http.Client{Timeout: 90 * time.Second}}, nil
}

// token is --token, DROVER_TOKEN, or the token drover dev wrote.
func (f APIFlags) token() (string, error) {
	if f.Token != "" {
		return f.Token, nil
	}
	b, err := os.ReadFile(filepath.Join(".drover", "operator.token"))
	if err != nil {
		return "", fmt.Errorf("no operator token: pass --token or set DROVER_TOKEN (drover dev writes ./.drover/operator.token)")
	}
	return strings.TrimSpace(string(b)), nil
}

// call sends in as JSON and decodes the answer into out. Errors carry the
// API's code, message, field errors and correlation id.
func (c *operatorClient) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("operator API %s unreachable: %w", c.base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var eb api.ErrorBody
		if json.Unmarshal(raw, &eb) != nil || eb.Error.Code == "" {
			return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(raw)))
		}
		msg := fmt.Sprintf("%s (%s, HTTP %d", eb.Error.Message, eb.Error.Code, resp.StatusCode)
		if eb.Error.CorrelationID != "" {
			msg += ", correlation_id " + eb.Error.CorrelationID
		}
		msg += ")"
		for _, f := range eb.Error.Fields {
			msg += fmt.Sprintf("\n  %s: %s", f.Field, f.Message)
		}
		return fmt.Errorf("%s", msg)
	}
	if b, ok := out.(*[]byte); ok { // raw bodies (recordings)
		*b = raw
		return nil
	}
	if out != nil && len(raw) > 0 {
		return json.Unmarshal(raw, out)
	}
	return nil
}
