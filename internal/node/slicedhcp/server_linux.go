//go:build linux

package slicedhcp

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
)

// Server answers DHCPv4 on the slice bridge from a Store.
type Server struct {
	cfg   Config
	store *Store
}

// NewServer checks cfg; it opens nothing (Serve does).
func NewServer(cfg Config, store *Store) (*Server, error) {
	if store == nil {
		return nil, errors.New("slicedhcp: a store is required")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, store: store}, nil
}

// Start listens on UDP port 67 bound to the bridge (SO_BINDTODEVICE, in
// the calling goroutine's network namespace) and answers in the
// background until ctx ends; done then yields nil, or the error that
// stopped the server early. Failing to open the socket (no such
// interface, port 67 taken by another DHCP server) is Start's error,
// naming the bridge: once Start returns, requests are answered.
func (s *Server) Start(ctx context.Context) (done <-chan error, err error) {
	conn, err := server4.NewIPv4UDPConn(s.cfg.Interface, &net.UDPAddr{Port: dhcpv4.ServerPort})
	if err != nil {
		return nil, fmt.Errorf("slicedhcp: listen on %s port %d: %w", s.cfg.Interface, dhcpv4.ServerPort, err)
	}
	srv, err := server4.NewServer(s.cfg.Interface, nil, s.handle, server4.WithConn(conn))
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("slicedhcp: server on %s: %w", s.cfg.Interface, err)
	}
	s.cfg.Log.Info("slicedhcp: serving reservations", "interface", s.cfg.Interface, "subnet", s.cfg.Subnet,
		"server_ip", s.cfg.ServerIP, "reservations_dir", s.store.Dir(), "vms", len(s.store.VMs()))
	ch := make(chan error, 1)
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	go func() {
		defer stop()
		err := srv.Serve()
		if ctx.Err() != nil {
			err = nil
		} else {
			err = fmt.Errorf("slicedhcp: serve on %s: %w", s.cfg.Interface, err)
		}
		ch <- err
	}()
	return ch, nil
}

// handle answers one request (server4 calls it per packet).
func (s *Server) handle(conn net.PacketConn, _ net.Addr, req *dhcpv4.DHCPv4) {
	resp, err := reply(s.cfg, s.store, req)
	if err != nil {
		s.cfg.Log.Debug("slicedhcp: no answer", "type", req.MessageType().String(), "mac", req.ClientHWAddr.String(), "why", err)
		return
	}
	to := replyAddr(req, resp)
	if _, err := conn.WriteTo(resp.ToBytes(), to); err != nil {
		s.cfg.Log.Warn("slicedhcp: send answer", "to", to.String(), "mac", req.ClientHWAddr.String(), "err", err)
		return
	}
	s.cfg.Log.Info("slicedhcp: answered", "type", resp.MessageType().String(), "mac", req.ClientHWAddr.String(),
		"ip", resp.YourIPAddr.String())
}
