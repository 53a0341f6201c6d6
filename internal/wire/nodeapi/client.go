package nodeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// maxResponse bounds how much of an answer the client reads.
const maxResponse = 4 << 20

// Error is a non-2xx answer from the control plane: an api.CodedError with
// the code and message of its error envelope ({"error": {"code",
// "message"}}) when it had one.
type Error struct {
	api.CodedError
	Status int
	Body   string // the whole answer, for logs
	// RetryAfter is the answer's Retry-After (seconds), zero when absent.
	RetryAfter time.Duration
}

// Error is "control plane answered status code: message", or the body
// when the answer had no envelope.
func (e *Error) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("control plane answered %d %s: %s", e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("control plane answered %d: %s", e.Status, e.Body)
}

// Retryable reports whether trying again later may succeed: server errors,
// rate limits and request timeouts are; auth and validation errors are not.
func (e *Error) Retryable() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests || e.Status == http.StatusRequestTimeout
}

// IsStatus reports whether err is an *Error with the given status.
func IsStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// Client calls the node-facing API over an *http.Client the caller
// configures (TLS, client certificate, proxies). Transport errors are
// returned as the *http.Client returns them (*url.Error).
type Client struct {
	base *url.URL
	hc   *http.Client

	// beatMu guards the last heartbeat body the control plane accepted
	// and the ETag it answered: an identical next heartbeat is sent
	// without its body, as If-Match.
	beatMu   sync.Mutex
	lastBeat []byte
	beatTag  string
}

// NewClient returns a client for the node API at baseURL. A route's path
// replaces baseURL's path.
func NewClient(hc *http.Client, baseURL string) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("control plane URL: %w", err)
	}
	return &Client{base: u, hc: hc}, nil
}

// Register enrols a host with its bootstrap token.
func (c *Client) Register(ctx context.Context, req api.RegisterRequest) (api.Identity, error) {
	var ident api.Identity
	_, err := call(ctx, c, Register, Register.Path(), "", "", &req, &ident)
	return ident, err
}

// Renew asks for a fresh certificate for node nodeID.
func (c *Client) Renew(ctx context.Context, nodeID string, req api.RenewRequest) (api.Identity, error) {
	var ident api.Identity
	_, err := call(ctx, c, Renew, Renew.Path(nodeID), "", "", &req, &ident)
	return ident, err
}

// Heartbeat reports liveness and capacity. It asks for the minimal answer
// (Prefer: return=minimal: a 204 with the interval in a header, one HTTP/2
// frame instead of two) and reads a HeartbeatResponse body from a control
// plane that does not honour it. A heartbeat whose body is the one last
// accepted goes without it, as If-Match with the ETag that answer carried;
// a 412 (the replica does not hold it: another replica, a restart) or a 422
// (a replica from before If-Match) is answered by sending the body at once.
func (c *Client) Heartbeat(ctx context.Context, nodeID string, hb api.Heartbeat) (api.HeartbeatResponse, error) {
	body, err := json.Marshal(hb)
	if err != nil {
		return api.HeartbeatResponse{}, err
	}
	c.beatMu.Lock()
	tag := ""
	if bytes.Equal(body, c.lastBeat) {
		tag = c.beatTag
	}
	c.beatMu.Unlock()
	if tag != "" {
		resp, err := c.heartbeat(ctx, nodeID, nil, tag)
		// 422: a replica that predates If-Match read no body as bad JSON.
		if !IsStatus(err, http.StatusPreconditionFailed) && !IsStatus(err, http.StatusUnprocessableEntity) {
			return resp, err
		}
	}
	return c.heartbeat(ctx, nodeID, body, "")
}

// heartbeat sends one heartbeat: body, or none and If-Match tag. It keeps
// (or forgets, on an error) what the next one may send instead of body.
func (c *Client) heartbeat(ctx context.Context, nodeID string, body []byte, tag string) (api.HeartbeatResponse, error) {
	var resp api.HeartbeatResponse
	hdr := http.Header{api.HeaderPrefer: {api.PreferMinimal}}
	if body == nil {
		hdr["If-Match"] = []string{tag}
	}
	status, h, err := exchange(ctx, c, Heartbeat.Method(), Heartbeat.Path(nodeID), "", "", hdr, body, &resp)
	if err == nil && status == http.StatusNoContent {
		if v := h.Get(api.HeaderHeartbeatInterval); v != "" {
			d, perr := time.ParseDuration(v)
			if perr != nil || d <= 0 {
				err = fmt.Errorf("heartbeat answer: %s %q is not a positive duration", api.HeaderHeartbeatInterval, v)
			}
			resp.HeartbeatInterval = api.Duration(d)
		}
	}
	switch {
	case err != nil:
		c.forgetBeat()
	case body != nil:
		c.beatMu.Lock()
		c.lastBeat, c.beatTag = body, h.Get("ETag") // none from a control plane without If-Match
		c.beatMu.Unlock()
	}
	return resp, err
}

// forgetBeat makes the next heartbeat carry its body.
func (c *Client) forgetBeat() {
	c.beatMu.Lock()
	c.lastBeat, c.beatTag = nil, ""
	c.beatMu.Unlock()
}

// JWKS fetches the task-signing public keys.
func (c *Client) JWKS(ctx context.Context, nodeID string) (api.JWKS, error) {
	var jwks api.JWKS
	_, err := call(ctx, c, JWKS, JWKS.Path(nodeID), "", "", nil, &jwks)
	return jwks, err
}

// PutCapabilities replaces the host's reported capabilities.
func (c *Client) PutCapabilities(ctx context.Context, nodeID string, caps api.Capabilities) error {
	_, err := call(ctx, c, PutCapabilities, PutCapabilities.Path(nodeID), "", "", &caps, nil)
	return err
}

// WaitTasks long-polls for up to max of the node's next tasks (GET
// .../tasks/wait?max=N, capped at api.MaxClaim by the server): the
// deliveries oldest first, none when the wait ended without one (204).
func (c *Client) WaitTasks(ctx context.Context, nodeID string, timeout time.Duration, max int) ([]api.TaskDelivery, error) {
	var d api.TaskDelivery
	q := "timeout=" + url.QueryEscape(timeout.String()) + "&max=" + strconv.Itoa(max)
	status, err := call(ctx, c, WaitTask, WaitTask.Path(nodeID), q, "", nil, &d)
	if err != nil || status != http.StatusOK {
		return nil, err
	}
	more := d.More
	d.More = nil
	return append([]api.TaskDelivery{d}, more...), nil
}

// PostEvent reports progress of task taskID; cid is its correlation id.
func (c *Client) PostEvent(ctx context.Context, nodeID, taskID, cid string, ev api.TaskEvent) error {
	_, err := call(ctx, c, PostEvent, PostEvent.Path(nodeID, taskID), "", cid, &ev, nil)
	return err
}

// PostResult reports the result of task taskID; cid is its correlation id.
func (c *Client) PostResult(ctx context.Context, nodeID, taskID, cid string, res api.TaskResult) (ResultAck, error) {
	var ack ResultAck
	_, err := call(ctx, c, PostResult, PostResult.Path(nodeID, taskID), "", cid, &res, &ack)
	return ack, err
}

// PostResults reports the results of several tasks in one request: one
// answer per result, in order, each with the status the single route would
// have given it. err is for the request as a whole.
func (c *Client) PostResults(ctx context.Context, nodeID string, results []api.TaskResultFor) (ResultsAck, error) {
	var ack ResultsAck
	_, err := call(ctx, c, PostResults, PostResults.Path(nodeID), "", "", &api.TaskResults{Results: results}, &ack)
	return ack, err
}

// DesiredInstances long-polls the node's desired instance set: the server
// answers at once when it differs from etag, else when it changes or wait
// ends.
func (c *Client) DesiredInstances(ctx context.Context, nodeID string, wait time.Duration, etag string) (api.NodeInstances, error) {
	var set api.NodeInstances
	q := "wait=" + wait.String() + "&etag=" + url.QueryEscape(etag)
	_, err := call(ctx, c, DesiredInstances, DesiredInstances.Path(nodeID), q, "", nil, &set)
	return set, err
}

// InstanceStatus reports a transition of instance instanceID.
func (c *Client) InstanceStatus(ctx context.Context, nodeID, instanceID string, rep api.InstanceStatusReport) (api.Instance, error) {
	var in api.Instance
	_, err := call(ctx, c, InstanceStatus, InstanceStatus.Path(nodeID, instanceID), "", "", &rep, &in)
	return in, err
}

// InstanceSecrets fetches the values of the secrets instance instanceID's
// spec names (only an instance placed on nodeID). The answer holds secret
// values: keep it in memory only, and never log it.
func (c *Client) InstanceSecrets(ctx context.Context, nodeID, instanceID, cid string) (api.InstanceSecrets, error) {
	var out api.InstanceSecrets
	_, err := call(ctx, c, InstanceSecrets, InstanceSecrets.Path(nodeID, instanceID), "", cid, nil, &out)
	return out, err
}

// TerminalURL is the URL of the node leg of terminal session sessionID.
func (c *Client) TerminalURL(nodeID, sessionID string) string {
	return TerminalURL(c.base, nodeID, sessionID)
}

// TerminalURL is base (its path kept, without a trailing slash) followed by
// the terminal stream path of session sessionID of node nodeID.
func TerminalURL(base *url.URL, nodeID, sessionID string) string {
	return strings.TrimRight(base.String(), "/") + TerminalStream.Path(nodeID, sessionID)
}

// LogsURL is base (its path kept, without a trailing slash) followed by the
// logs stream path of session sessionID of node nodeID.
func LogsURL(base *url.URL, nodeID, sessionID string) string {
	return strings.TrimRight(base.String(), "/") + LogsStream.Path(nodeID, sessionID)
}

// typed is a route whose bodies are Req and Resp.
type typed[Req, Resp any] interface {
	Method() string
	bodies(*Req, *Resp)
}

// call sends in (JSON, none if nil) to path?query and decodes a 2xx answer
// other than 204 into out (if non-nil). It returns the HTTP status, and an
// *Error for a status of 300 or more.
func call[Req, Resp any](ctx context.Context, c *Client, r typed[Req, Resp], path, query, cid string, in *Req, out *Resp) (int, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return 0, err
		}
	}
	status, _, err := exchange(ctx, c, r.Method(), path, query, cid, nil, body, out)
	return status, err
}

// exchange is call with the JSON body already encoded (none if nil) and
// extra request headers hdr (may be nil); it returns the answer's headers
// as well.
func exchange[Resp any](ctx context.Context, c *Client, method, path, query, cid string, hdr http.Header,
	in []byte, out *Resp) (int, http.Header, error) {
	var body io.Reader
	if in != nil {
		body = bytes.NewReader(in)
	}
	ref, err := url.Parse(path)
	if err != nil {
		return 0, nil, err
	}
	ref.RawQuery = query
	req, err := http.NewRequestWithContext(ctx, method, c.base.ResolveReference(ref).String(), body)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cid != "" {
		req.Header.Set(api.HeaderCorrelationID, cid)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// The connection failed: the control plane may have restarted and
		// forgotten the last heartbeat, so the next one carries its body
		// instead of costing every agent a 412 after a restart.
		c.forgetBeat()
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return resp.StatusCode, resp.Header, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode, Body: string(raw)}
		var eb api.ErrorBody
		if json.Unmarshal(raw, &eb) == nil {
			e.Code, e.Message = eb.Error.Code, eb.Error.Message
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return resp.StatusCode, resp.Header, e
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, resp.Header, fmt.Errorf("decode %s %s response: %w", method, req.URL.RequestURI(), err)
		}
	}
	return resp.StatusCode, resp.Header, nil
}
