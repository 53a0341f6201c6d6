package agent

import "github.com/prometheus/client_golang/prometheus"

// metrics are the agent's Prometheus series on its own registry.
type metrics struct {
	heartbeats        prometheus.Counter
	heartbeatFailures *prometheus.CounterVec
	pollFailures      *prometheus.CounterVec
	tasksReceived     prometheus.Counter
	tasksRejected     *prometheus.CounterVec
	tasksDuplicate    prometheus.Counter
	resultsPosted     prometheus.Counter
	resultFailures    prometheus.Counter
	spoolPending      prometheus.Gauge
	orphanOverlays    prometheus.Counter
	jwksRefreshes     *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_agent_heartbeats_total", Help: "Heartbeats accepted by the control plane."}),
		heartbeatFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_agent_heartbeat_failures_total", Help: "Failed heartbeats by reason."}, []string{"reason"}),
		pollFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_agent_task_poll_failures_total", Help: "Failed task polls by reason."}, []string{"reason"}),
		tasksReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_agent_tasks_received_total", Help: "Task deliveries received."}),
		tasksRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_agent_tasks_rejected_total", Help: "Deliveries refused before execution, by code."}, []string{"code"}),
		tasksDuplicate: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_agent_tasks_duplicate_total", Help: "Redelivered task ids that were not run again."}),
		resultsPosted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_agent_results_posted_total", Help: "Task results accepted by the control plane."}),
		resultFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_agent_result_post_failures_total", Help: "Result posts that failed and stay spooled."}),
		spoolPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "drover_agent_spool_pending", Help: "Results on disk waiting to be posted."}),
		orphanOverlays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_agent_orphan_overlays_removed_total",
			Help: "Instance overlays removed by the safety loop because no instance owned them."}),
		jwksRefreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_agent_jwks_refreshes_total",
			Help: "JWKS refreshes on an unknown kid, by result: ok, failed, throttled (not attempted)."}, []string{"result"}),
	}
	reg.MustRegister(m.heartbeats, m.heartbeatFailures, m.pollFailures, m.tasksReceived, m.tasksRejected,
		m.tasksDuplicate, m.resultsPosted, m.resultFailures, m.spoolPending, m.orphanOverlays, m.jwksRefreshes)
	return m
}
