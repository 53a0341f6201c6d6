// Package nodeapi is the node-facing API of the control plane as one typed
// table: every route the agent speaks, with its method, path pattern, the
// credential it needs and its request and response bodies (internal/wire/api
// types). The control plane registers its node routes from this table, and
// the agent, the terminal stream dialer and the benchmark build their paths
// and requests from it, so a route cannot change on one side only.
//
// Each route is a typed constant whose value is its http.ServeMux pattern
// ("POST /internal/v1/nodes/{id}/heartbeat"); its type fixes the request and
// response bodies and the arguments of its path builder.
package nodeapi

import (
	"net/http"
	"net/url"
	"reflect"
	"strings"

	"github.com/drover-dev/drover/internal/wire/api"
)

// Auth is the credential a route requires.
type Auth int

// Credentials.
const (
	// AuthBootstrapToken: no client certificate; the request body carries
	// the host's bootstrap token.
	AuthBootstrapToken Auth = iota + 1
	// AuthNodeCert: an mTLS client certificate issued by the control plane's
	// CA whose node id equals the path's {id}.
	AuthNodeCert
)

func (a Auth) String() string {
	switch a {
	case AuthBootstrapToken:
		return "bootstrap_token"
	case AuthNodeCert:
		return "node_certificate"
	}
	return "unknown"
}

// NoBody is the body of a request that sends none, or of a response that
// carries none (204 No Content, or a WebSocket upgrade).
type NoBody struct{}

// ResultAck is the answer to a task result: the task and the state the
// result moved it to.
type ResultAck struct {
	TaskID string        `json:"task_id"`
	State  api.TaskState `json:"state"`
}

// ResultsAck is the answer to POST .../tasks/results: one entry per result,
// in the request's order.
type ResultsAck struct {
	Results []ResultItemAck `json:"results"`
}

// ResultItemAck is one result's answer: Status is what POST
// .../tasks/{task_id}/result would have answered; State the task's state
// after a 200, Error the refusal otherwise (404 task_not_found, 409
// task_conflict, 422 invalid_payload, 500 internal).
type ResultItemAck struct {
	TaskID string           `json:"task_id"`
	Status int              `json:"status"`
	State  api.TaskState    `json:"state,omitempty"`
	Error  *api.ErrorDetail `json:"error,omitempty"`
}

// Err is the result's refusal as the single route's *Error would carry
// it; nil for a 200.
func (a ResultItemAck) Err() error {
	if a.Status == http.StatusOK {
		return nil
	}
	e := &Error{Status: a.Status}
	if a.Error != nil {
		e.CodedError = api.CodedError{Code: a.Error.Code, Message: a.Error.Message, Fields: a.Error.Fields}
	}
	return e
}

// BootstrapRoute is a route without path parameters that a host calls
// before it has a certificate.
type BootstrapRoute[Req, Resp any] string

// NodeRoute is a route of one node: /internal/v1/nodes/{id}/...
type NodeRoute[Req, Resp any] string

// NodeItemRoute is a route of one item of a node (a task, an instance, a
// terminal session): /internal/v1/nodes/{id}/.../{item}.
type NodeItemRoute[Req, Resp any] string

// The node-facing routes.
const (
	Register         BootstrapRoute[api.RegisterRequest, api.Identity]     = "POST /internal/v1/register"
	Renew            NodeRoute[api.RenewRequest, api.Identity]             = "POST /internal/v1/nodes/{id}/renew"
	Heartbeat        NodeRoute[api.Heartbeat, api.HeartbeatResponse]       = "POST /internal/v1/nodes/{id}/heartbeat"
	JWKS             NodeRoute[NoBody, api.JWKS]                           = "GET /internal/v1/nodes/{id}/jwks"
	PutCapabilities  NodeRoute[api.Capabilities, NoBody]                   = "PUT /internal/v1/nodes/{id}/capabilities"
	WaitTask         NodeRoute[NoBody, api.TaskDelivery]                   = "GET /internal/v1/nodes/{id}/tasks/wait"
	PostEvent        NodeItemRoute[api.TaskEvent, NoBody]                  = "POST /internal/v1/nodes/{id}/tasks/{task_id}/events"
	PostResult       NodeItemRoute[api.TaskResult, ResultAck]              = "POST /internal/v1/nodes/{id}/tasks/{task_id}/result"
	PostResults      NodeRoute[api.TaskResults, ResultsAck]                = "POST /internal/v1/nodes/{id}/tasks/results"
	DesiredInstances NodeRoute[NoBody, api.NodeInstances]                  = "GET /internal/v1/nodes/{id}/instances"
	InstanceStatus   NodeItemRoute[api.InstanceStatusReport, api.Instance] = "POST /internal/v1/nodes/{id}/instances/{iid}/status"
	InstanceSecrets  NodeItemRoute[NoBody, api.InstanceSecrets]            = "GET /internal/v1/nodes/{id}/instances/{iid}/secrets"
	TerminalStream   NodeItemRoute[NoBody, NoBody]                         = "GET /internal/v1/nodes/{id}/terminal/{session_id}"
	LogsStream       NodeItemRoute[NoBody, NoBody]                         = "GET /internal/v1/nodes/{id}/logs/{session_id}"
)

// Route is one entry of the table, for code that walks all routes.
type Route struct {
	Name    string
	Method  string
	Pattern string // path pattern in http.ServeMux syntax
	Auth    Auth
	// Request and Response are the JSON body types; nil for none.
	Request, Response reflect.Type
	// Stream marks a WebSocket upgrade rather than a JSON exchange.
	Stream bool
}

// MuxPattern is the route's http.ServeMux pattern: "METHOD /path".
func (r Route) MuxPattern() string { return r.Method + " " + r.Pattern }

// Routes returns the table: every node-facing route, once.
func Routes() []Route {
	return []Route{
		Register.entry("register"),
		Renew.entry("renew"),
		Heartbeat.entry("heartbeat"),
		JWKS.entry("jwks"),
		PutCapabilities.entry("put_capabilities"),
		WaitTask.entry("wait_task"),
		PostEvent.entry("post_event"),
		PostResult.entry("post_result"),
		PostResults.entry("post_results"),
		DesiredInstances.entry("desired_instances"),
		InstanceStatus.entry("instance_status"),
		InstanceSecrets.entry("instance_secrets"),
		withStream(TerminalStream.entry("terminal_stream")),
		withStream(LogsStream.entry("logs_stream")),
	}
}

func withStream(r Route) Route {
	r.Stream = true
	return r
}

// Method is the route's HTTP method.
func (r BootstrapRoute[Req, Resp]) Method() string { return method(string(r)) }

// Pattern is the route's path pattern.
func (r BootstrapRoute[Req, Resp]) Pattern() string { return pattern(string(r)) }

// Path is the route's path.
func (r BootstrapRoute[Req, Resp]) Path() string { return pattern(string(r)) }

// MuxPattern is the route's http.ServeMux pattern: "METHOD /path".
func (r BootstrapRoute[Req, Resp]) MuxPattern() string { return string(r) }

func (r BootstrapRoute[Req, Resp]) bodies(*Req, *Resp) {}

func (r BootstrapRoute[Req, Resp]) entry(name string) Route {
	return route[Req, Resp](name, string(r), AuthBootstrapToken)
}

// Method is the route's HTTP method.
func (r NodeRoute[Req, Resp]) Method() string { return method(string(r)) }

// Pattern is the route's path pattern.
func (r NodeRoute[Req, Resp]) Pattern() string { return pattern(string(r)) }

// Path is the route's path for node nodeID (escaped).
func (r NodeRoute[Req, Resp]) Path(nodeID string) string { return expand(pattern(string(r)), nodeID) }

// MuxPattern is the route's http.ServeMux pattern: "METHOD /path".
func (r NodeRoute[Req, Resp]) MuxPattern() string { return string(r) }

func (r NodeRoute[Req, Resp]) bodies(*Req, *Resp) {}

func (r NodeRoute[Req, Resp]) entry(name string) Route {
	return route[Req, Resp](name, string(r), AuthNodeCert)
}

// Method is the route's HTTP method.
func (r NodeItemRoute[Req, Resp]) Method() string { return method(string(r)) }

// Pattern is the route's path pattern.
func (r NodeItemRoute[Req, Resp]) Pattern() string { return pattern(string(r)) }

// Path is the route's path for item itemID of node nodeID (both escaped).
func (r NodeItemRoute[Req, Resp]) Path(nodeID, itemID string) string {
	return expand(pattern(string(r)), nodeID, itemID)
}

// MuxPattern is the route's http.ServeMux pattern: "METHOD /path".
func (r NodeItemRoute[Req, Resp]) MuxPattern() string { return string(r) }

func (r NodeItemRoute[Req, Resp]) bodies(*Req, *Resp) {}

func (r NodeItemRoute[Req, Resp]) entry(name string) Route {
	return route[Req, Resp](name, string(r), AuthNodeCert)
}

func method(muxPattern string) string {
	m, _, _ := strings.Cut(muxPattern, " ")
	return m
}

func pattern(muxPattern string) string {
	_, p, _ := strings.Cut(muxPattern, " ")
	return p
}

func route[Req, Resp any](name, muxPattern string, auth Auth) Route {
	return Route{Name: name, Method: method(muxPattern), Pattern: pattern(muxPattern), Auth: auth,
		Request: bodyType[Req](), Response: bodyType[Resp]()}
}

func bodyType[T any]() reflect.Type {
	t := reflect.TypeFor[T]()
	if t == reflect.TypeFor[NoBody]() {
		return nil
	}
	return t
}

// expand replaces the pattern's wildcards, in order, with the escaped args.
// The route types fix the number of args to the number of wildcards
// (TestPathBuilders checks every route).
func expand(p string, args ...string) string {
	var b strings.Builder
	b.Grow(len(p) + 32)
	for _, a := range args {
		i := strings.IndexByte(p, '{')
		j := strings.IndexByte(p, '}')
		if i < 0 || j < i {
			break
		}
		b.WriteString(p[:i])
		b.WriteString(url.PathEscape(a))
		p = p[j+1:]
	}
	b.WriteString(p)
	return b.String()
}
