// Package hosts owns the hosts: the operator's host routes (create, list,
// show, enable/disable, drain/undrain, bootstrap token rotation, revoke) and
// slot approvals, enrolment (register, with its rate limits), node
// authentication (NodeAuth binds every node route to the caller's
// certificate), certificate renewal, heartbeats and liveness (in memory,
// written on transitions and in coalesced flushes), capability reports, and
// a cache of the host state node requests need. It must not queue tasks or
// place instances (it wakes Instances when a host drains), and keeps no host
// state beyond that cache and liveness (the pending heartbeats and the last
// heartbeat of each host heard from lately, decoded, with its digest):
// hosts are in the Store.
package hosts

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/drover-dev/drover/internal/cp/audit"
	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// Store is what the hosts room reads and writes: the host records and their
// approved slots, and the discovery task a slot approval names. store.Store
// satisfies it.
type Store interface {
	store.HostStore
	store.SlotStore
	GetTask(ctx context.Context, id string) (store.Task, error)
}

// CA signs node certificates (pki.CA).
type CA interface {
	SignNodeCSR(csrPEM []byte, nodeID string, ttl time.Duration, now time.Time) (
		certPEM []byte, serial string, notAfter time.Time, err error)
	CertPEM() []byte
	Hash() string
	VerifyExpiredNode(certPEM []byte, now time.Time, grace time.Duration) (*x509.Certificate, string, error)
}

// Keys is the task-signing keyring's public set (keys.Keys).
type Keys interface {
	PublicSet() api.JWKS
}

// Instances is woken when a host's draining flag changes (it is part of
// the node's desired instance set).
type Instances interface {
	Wake(nodeID string)
}

// LocalWorkloads, when the Instances given to New has it, keeps the
// instance records of the local workloads a host's agent declares in its
// capabilities (instances.Room.SyncLocalWorkloads).
type LocalWorkloads interface {
	SyncLocalWorkloads(ctx context.Context, hostID string, declared []api.PresetRequest)
}

// Metrics are the room's series, registered by the control plane.
type Metrics struct {
	Heartbeats                                   prometheus.Counter
	Registrations, NodeAuthFailed, StatusChanges *prometheus.CounterVec
}

// Config configures the room (see server.Config for each field).
type Config struct {
	NodeURL                      string
	AllowUnknownHostRegistration bool
	CertTTL                      time.Duration
	ReenrolGrace                 time.Duration // <= 0: no enrolment by a previous certificate
	HeartbeatInterval            time.Duration
	BootstrapTokenTTL            time.Duration
	RegisterRate                 rate.Limit
	RegisterBurst                int
	AuthFailRate                 rate.Limit
	AuthFailBurst                int
	Log                          *slog.Logger
	Now                          func() time.Time
}

// Room serves the host routes and authenticates nodes.
type Room struct {
	cfg       Config
	store     Store
	ca        CA
	keys      Keys
	instances Instances
	audit     *audit.Log
	metrics   Metrics
	log       *slog.Logger
	cache     *hostCache
	live      *liveness
	limiter   *httpapi.IPLimiter
	// authFails limits failed enrolments per source and per host id.
	authFails *failLimiter
	// heartbeatReply is the constant heartbeat answer, encoded once, and
	// jsonContentType its Content-Type header value; intervalHeader is the
	// minimal answer's Drover-Heartbeat-Interval value.
	heartbeatReply  []byte
	jsonContentType []string
	intervalHeader  []string
	// bodies are reused heartbeat body buffers (*[]byte).
	bodies sync.Pool
}

// New is the hosts room.
func New(cfg Config, st Store, ca CA, keys Keys, instances Instances, auditLog *audit.Log, m Metrics) *Room {
	s := &Room{cfg: cfg, store: st, ca: ca, keys: keys, instances: instances, audit: auditLog, metrics: m, log: cfg.Log,
		cache:     newHostCache(st, cfg.Now),
		limiter:   httpapi.NewIPLimiter(cfg.RegisterRate, cfg.RegisterBurst, cfg.Now),
		authFails: newFailLimiter(cfg.AuthFailRate, cfg.AuthFailBurst, cfg.Now)}
	s.live = newLiveness(s)
	s.heartbeatReply, _ = json.Marshal(api.HeartbeatResponse{HeartbeatInterval: api.Duration(cfg.HeartbeatInterval)})
	s.jsonContentType = []string{"application/json"}
	s.intervalHeader = []string{cfg.HeartbeatInterval.String()}
	s.bodies.New = func() any { b := make([]byte, 0, 1024); return &b }
	return s
}

// Run fills the host cache, then, until ctx ends, sweeps liveness (flush,
// then mark stale hosts) every heartbeat interval and refreshes the cache
// every hostCacheRefresh.
func (s *Room) Run(ctx context.Context) {
	// One read of every host instead of one per agent's first request:
	// after a restart the whole fleet reconnects at once.
	s.refreshCache(ctx)
	sweep, refresh := time.NewTicker(s.cfg.HeartbeatInterval), time.NewTicker(hostCacheRefresh)
	defer sweep.Stop()
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sweep.C:
			s.live.sweep(ctx)
		case <-refresh.C:
			s.refreshCache(ctx)
		}
	}
}

func (s *Room) refreshCache(ctx context.Context) {
	if err := s.cache.refresh(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("refresh host cache", "err", err)
	}
}

// Flush writes the coalesced heartbeats (on a clean stop).
func (s *Room) Flush(ctx context.Context) { s.live.flush(ctx) }

// Invalidate drops a host's cached state (a host change event).
func (s *Room) Invalidate(id string) { s.cache.invalidate(id) }

// InvalidateAll drops every host's cached state (change events were lost).
func (s *Room) InvalidateAll() { s.cache.invalidateAll() }

// updateHost is the store's UpdateHostAudited under the host's write lock,
// caching the row it wrote (hostCache.lockWrite).
func (s *Room) updateHost(ctx context.Context, id string, fn func(*store.Host) error,
	audit func(before, after store.Host) []store.AuditEvent) (store.Host, error) {
	defer s.cache.lockWrite(id)()
	h, err := s.store.UpdateHostAudited(ctx, id, fn, audit)
	if err == nil {
		s.cache.put(h)
	}
	return h, err
}

// NodeOnline reports whether a node's agent is heard from and allowed in.
func (s *Room) NodeOnline(ctx context.Context, id string) bool {
	hs, err := s.cache.get(ctx, id)
	if err != nil || hs.revoked || !hs.enabled {
		return false
	}
	switch hs.status {
	case api.HostStale, api.HostUnknown, api.HostAuthFailed, "":
		return false
	}
	return true
}

// NodeRevoked reports whether a node's identity was revoked.
func (s *Room) NodeRevoked(ctx context.Context, id string) (bool, error) {
	hs, err := s.cache.get(ctx, id)
	if err != nil {
		return false, err
	}
	return hs.revoked, nil
}
