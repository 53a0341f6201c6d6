package tasks

import "github.com/prometheus/client_golang/prometheus"

// NewMetrics creates the room's series and registers them on reg.
func NewMetrics(reg prometheus.Registerer) Metrics {
	m := Metrics{
		Enqueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_enqueued_total", Help: "Tasks enqueued."}),
		Claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_claimed_total", Help: "Tasks delivered to agents."}),
		Results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_task_results_total", Help: "Task results recorded by state."}, []string{"state"}),
		Requeued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_requeued_total", Help: "Dispatched tasks requeued after their lease ended."}),
		Expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_tasks_expired_total", Help: "Tasks that expired before completing."}),
	}
	reg.MustRegister(m.Enqueued, m.Claimed, m.Results, m.Requeued, m.Expired)
	return m
}
