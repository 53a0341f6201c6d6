package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveLocal serves the agent's local API: GET /healthz,
// GET /v1/capacity, GET /v1/instances (what the reconciler observes) and
// GET /metrics. It is meant for loopback.
func (a *Agent) serveLocal(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /v1/capacity", func(w http.ResponseWriter, r *http.Request) {
		writeLocalJSON(w, http.StatusOK, a.capacity(r.Context()))
	})
	mux.HandleFunc("GET /v1/instances", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		vms := a.vms
		a.mu.Unlock()
		if vms == nil {
			writeLocalJSON(w, http.StatusOK, []struct{}{})
			return
		}
		writeLocalJSON(w, http.StatusOK, vms.rec.Instances())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	srv := newLocalServer(mux, defaultLocalLimits)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// localLimits bound the local API's connections. It has no long-polls, no
// WebSockets and no request bodies, so whole-request read and write
// deadlines are safe.
type localLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes                int
}

var defaultLocalLimits = localLimits{readHeader: 5 * time.Second, read: 10 * time.Second,
	write: 30 * time.Second, idle: time.Minute, maxHeaderBytes: 16 << 10}

func newLocalServer(h http.Handler, l localLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.readHeader, ReadTimeout: l.read,
		WriteTimeout: l.write, IdleTimeout: l.idle, MaxHeaderBytes: l.maxHeaderBytes}
}

// healthz answers the status document: 200 while the agent heartbeats
// and has no problem, 503 otherwise, with the signal, its detail and since
// when, so a supervisor, `drover-agent status` or preflight can name the
// failed hop.
func (a *Agent) healthz(w http.ResponseWriter, _ *http.Request) {
	st, ok := a.Status()
	status := http.StatusOK
	if !ok {
		status = http.StatusServiceUnavailable
	}
	writeLocalJSON(w, status, st)
}

func writeLocalJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
