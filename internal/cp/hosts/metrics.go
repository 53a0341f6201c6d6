package hosts

import "github.com/prometheus/client_golang/prometheus"

// NewMetrics creates the room's series and registers them on reg.
func NewMetrics(reg prometheus.Registerer) Metrics {
	m := Metrics{
		Heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "drover_heartbeats_total", Help: "Heartbeats received."}),
		Registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_registrations_total", Help: "Enrolment attempts by result."}, []string{"result"}),
		NodeAuthFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_node_auth_failures_total", Help: "Refused node requests by reason."}, []string{"reason"}),
		StatusChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_host_status_changes_total", Help: "Host status transitions by new status."}, []string{"status"}),
	}
	reg.MustRegister(m.Heartbeats, m.Registrations, m.NodeAuthFailed, m.StatusChanges)
	return m
}
