package termgw

import "github.com/prometheus/client_golang/prometheus"

// NewMetrics creates the gateway's series and registers them on reg;
// limitRefusals is the per-node cap refusal counter it shares with the
// node long-poll caps (httpapi.NewLimitRefusals), already registered.
func NewMetrics(reg prometheus.Registerer, limitRefusals *prometheus.CounterVec) Metrics {
	m := Metrics{
		Mints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_token_mints_total", Help: "Terminal token mints by result (ok or error code)."}, []string{"result"}),
		Sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_sessions_total",
			Help: "Terminal session outcomes: ready, an error code, or closed_<reason>."}, []string{"result"}),
		NodeStreams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_node_streams_total", Help: "Node terminal stream attempts by result."}, []string{"result"}),
		OpenSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "drover_terminal_open_seconds",
			Help:    "Time from the browser's upgrade to the PTY being ready.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		Revoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_terminal_sessions_revoked_total",
			Help: "Live terminal sessions ended because their host, allocation or minting token went away, by code."},
			[]string{"code"}),
		LimitRefusals: limitRefusals,
	}
	reg.MustRegister(m.Mints, m.Sessions, m.NodeStreams, m.OpenSeconds, m.Revoked)
	return m
}

// RegisterLiveSessions registers the drover_terminal_live_sessions gauge
// (sessions this replica holds a browser for) on reg.
func (g *Gateway) RegisterLiveSessions(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "drover_terminal_live_sessions",
		Help: "Terminal sessions this replica holds a browser for."}, func() float64 { return float64(g.Count()) }))
}
