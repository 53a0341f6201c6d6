package server

import (
	"net/http"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
)

// NodeHandler serves the node-facing API. It must be served over TLS with
// s.nodeTLS so that client certificates are verified.
func (s *Server) NodeHandler() http.Handler {
	mux := http.NewServeMux()
	for pattern, h := range s.nodeRoutes() {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return httpapi.WithCorrelation(mux)
}

// nodeRoutes is the handler of every route of the node API table
// (internal/wire/nodeapi), keyed by its ServeMux pattern; TestNodeRoutes
// checks it serves the table, all of it and nothing else.
func (s *Server) nodeRoutes() map[string]http.Handler {
	return map[string]http.Handler{
		nodeapi.Register.MuxPattern():        httpapi.Handle(s.log, s.hosts.Register),
		nodeapi.Renew.MuxPattern():           s.hosts.NodeAuth(s.hosts.Renew),
		nodeapi.Heartbeat.MuxPattern():       s.hosts.NodeAuth(s.hosts.Heartbeat),
		nodeapi.JWKS.MuxPattern():            s.hosts.NodeAuth(s.hosts.JWKS),
		nodeapi.PutCapabilities.MuxPattern(): s.hosts.NodeAuth(s.hosts.PutCapabilities),
		nodeapi.WaitTask.MuxPattern():        s.hosts.NodeAuthID(s.taskPolls.Limit(nil, s.tasks.Wait)),
		nodeapi.PostEvent.MuxPattern():       s.hosts.NodeAuthID(s.tasks.Event),
		nodeapi.PostResult.MuxPattern():      s.hosts.NodeAuthID(s.tasks.Result),
		nodeapi.PostResults.MuxPattern():     s.hosts.NodeAuthID(s.tasks.Results),
		nodeapi.DesiredInstances.MuxPattern(): s.hosts.NodeAuthID(
			s.instancePolls.Limit(httpapi.WaitRequested, s.inst.NodeDesired)),
		nodeapi.InstanceStatus.MuxPattern():  s.hosts.NodeAuthID(s.inst.NodeStatus),
		nodeapi.InstanceSecrets.MuxPattern(): s.hosts.NodeAuthID(s.secrets.NodeFetch),
		nodeapi.TerminalStream.MuxPattern():  s.term.NodeMTLS(s.hosts.NodeAuthID(s.term.NodeStream)),
		nodeapi.LogsStream.MuxPattern():      s.hosts.NodeAuthID(s.logs.NodeStream),
	}
}
