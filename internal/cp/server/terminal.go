package server

import (
	"context"

	"github.com/drover-dev/drover/internal/wire/api"
)

// nodeOnline reports whether a node's agent is heard from and allowed in.
func (s *Server) nodeOnline(ctx context.Context, id string) bool {
	hs, err := s.hosts.get(ctx, id)
	if err != nil || hs.revoked || !hs.enabled {
		return false
	}
	switch hs.status {
	case api.HostStale, api.HostUnknown, api.HostAuthFailed, "":
		return false
	}
	return true
}
