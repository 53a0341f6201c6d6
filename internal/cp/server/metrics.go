package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the control plane's Prometheus series, on a registry owned by
// the Server (no global state).
type metrics struct {
	heartbeats     prometheus.Counter
	registrations  *prometheus.CounterVec
	tasksEnqueued  prometheus.Counter
	tasksClaimed   prometheus.Counter
	taskResults    *prometheus.CounterVec
	tasksRequeued  prometheus.Counter
	tasksExpired   prometheus.Counter
	nodeAuthFailed *prometheus.CounterVec
	statusChanges  *prometheus.CounterVec

	terminalMints       *prometheus.CounterVec
	terminalSessions    *prometheus.CounterVec
	terminalNodeStreams *prometheus.CounterVec
	terminalOpenSeconds prometheus.Histogram
	terminalRevoked     *prometheus.CounterVec
	limitRefusals       *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_heartbeats_total", Help: "Heartbeats received."}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_registrations_total", Help: "Enrolment attempts by result."}, []string{"result"}),
		tasksEnqueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_enqueued_total", Help: "Tasks enqueued."}),
		tasksClaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_claimed_total", Help: "Tasks delivered to agents."}),
		taskResults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_task_results_total", Help: "Task results recorded by state."}, []string{"state"}),
		tasksRequeued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_requeued_total", Help: "Dispatched tasks requeued after their lease ended."}),
		tasksExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_expired_total", Help: "Tasks that expired before completing."}),
		nodeAuthFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_node_auth_failures_total", Help: "Refused node requests by reason."}, []string{"reason"}),
		statusChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_host_status_changes_total", Help: "Host status transitions by new status."}, []string{"status"}),
		terminalMints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_token_mints_total", Help: "Terminal token mints by result (ok or error code)."}, []string{"result"}),
		terminalSessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_sessions_total",
			Help: "Terminal session outcomes: ready, an error code, or closed_<reason>."}, []string{"result"}),
		terminalNodeStreams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_node_streams_total", Help: "Node terminal stream attempts by result."}, []string{"result"}),
		terminalOpenSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "drover_terminal_open_seconds",
			Help:    "Time from the browser's upgrade to the PTY being ready.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		terminalRevoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_sessions_revoked_total",
			Help: "Live terminal sessions ended because their host, allocation or minting token went away, by code."},
			[]string{"code"}),
		limitRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_limit_refusals_total",
			Help: "Requests refused by a per-node concurrency cap, by code."}, []string{"code"}),
	}
	reg.MustRegister(m.terminalMints, m.terminalSessions, m.terminalNodeStreams, m.terminalOpenSeconds,
		m.terminalRevoked, m.limitRefusals,
		m.heartbeats, m.registrations, m.tasksEnqueued, m.tasksClaimed, m.taskResults,
		m.tasksRequeued, m.tasksExpired, m.nodeAuthFailed, m.statusChanges,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
