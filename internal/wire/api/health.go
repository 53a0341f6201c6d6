package api

// HostHealth is what the last finished diag.health_probe said about a
// host (api.Host.Health): the control plane schedules the probe on every
// heartbeating host each health probe interval, and an operator's own
// diag.health_probe updates it too. It is separate from HostStatus, which
// heartbeats make.
type HostHealth string

// Host health values. A host never probed has none ("").
const (
	// HealthHealthy: the probe succeeded and every check passed.
	HealthHealthy HostHealth = "healthy"
	// HealthUnhealthy: the probe ran and a check failed (health_summary
	// names them).
	HealthUnhealthy HostHealth = "unhealthy"
	// HealthUnknown: the probe failed or expired without a report.
	HealthUnknown HostHealth = "unknown"
)
