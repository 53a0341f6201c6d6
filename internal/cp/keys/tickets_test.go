package keys

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/pki"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

// ticketServer is a node-listener-like TLS config whose tickets tk seals.
func ticketServer(p *terminaltest.PKI, tk *sessionTickets) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.Server},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: p.CA.Pool(),
		WrapSession: tk.wrap, UnwrapSession: tk.unwrap}
}

// handshake runs one TLS connection between server and client on loopback
// (the client reads one byte, which also takes in the session ticket) and
// returns the server's view of it.
func handshake(t testing.TB, server, client *tls.Config) tls.ConnectionState {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return handshakeOn(t, ln, server, client)
}

// handshakeOn is handshake on an open listener.
func handshakeOn(t testing.TB, ln net.Listener, server, client *tls.Config) tls.ConnectionState {
	t.Helper()
	type result struct {
		cs  tls.ConnectionState
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer a.Close()
		s := tls.Server(a, server)
		if err := s.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		_, err = s.Write([]byte("x"))
		done <- result{s.ConnectionState(), err}
	}()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c := tls.Client(b, client)
	if err := c.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("client read: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	return r.cs
}

// TestSessionTicketsAcrossRestartsAndCAs: a ticket sealed by one process
// opens in another that derives its keys from the same CA key (a restart,
// another replica) until two epochs have begun since; never under another
// CA's keys, nor after tampering.
func TestSessionTicketsAcrossRestartsAndCAs(t *testing.T) {
	p := terminaltest.NewPKI(t, "test CA", "node-a")
	_, caKey, err := pki.NewCA("test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := pki.NewCA("other CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 27, 0, 0, 1, 0, time.UTC) // just after an epoch began
	at := func(d time.Duration) func() time.Time { return func() time.Time { return t0.Add(d) } }
	// issuer seals tickets at t0. Only the ticket keys' clock moves: the
	// configs set no Time, so crypto/tls checks the client certificate's
	// validity against the wall clock.
	issuer, err := newSessionTickets(caKey, at(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		key    []byte
		now    time.Duration
		tamper func(ticket []byte) []byte
		resume bool
	}{
		{name: "same process key, same epoch", key: caKey, resume: true},
		{name: "restarted, next epoch", key: caKey, now: TicketEpoch, resume: true},
		{name: "two epochs later", key: caKey, now: 2 * TicketEpoch},
		{name: "clock behind: an epoch not begun", key: caKey, now: -time.Hour},
		{name: "another CA's keys", key: otherKey},
		{name: "ciphertext flipped", key: caKey, tamper: func(b []byte) []byte { b[len(b)-1] ^= 1; return b }},
		{name: "epoch rewritten", key: caKey, tamper: func(b []byte) []byte { b[8]--; return b }},
		{name: "other version", key: caKey, tamper: func(b []byte) []byte { b[0] = 2; return b }},
		{name: "truncated", key: caKey, tamper: func(b []byte) []byte { return b[:ticketHeader+ticketNonce-1] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.CA.Pool(), ServerName: "127.0.0.1",
				Certificates: []tls.Certificate{p.Node}, ClientSessionCache: tls.NewLRUClientSessionCache(1)}
			if cs := handshake(t, ticketServer(p, issuer), client); cs.DidResume {
				t.Fatal("the first connection resumed")
			}
			later, err := newSessionTickets(tc.key, at(tc.now))
			if err != nil {
				t.Fatal(err)
			}
			server := ticketServer(p, later)
			if tc.tamper != nil {
				unwrap := server.UnwrapSession
				server.UnwrapSession = func(b []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
					return unwrap(tc.tamper(append([]byte(nil), b...)), cs)
				}
			}
			cs := handshake(t, server, client)
			if cs.DidResume != tc.resume {
				t.Fatalf("resumed = %v, want %v", cs.DidResume, tc.resume)
			}
			// Resumed or not, the server knows the client's certificate.
			if len(cs.PeerCertificates) == 0 || !cs.PeerCertificates[0].Equal(p.Node.Leaf) {
				t.Fatalf("peer certificates %v, want the node's", cs.PeerCertificates)
			}
		})
	}
}

// BenchmarkNodeHandshake is one TLS 1.3 handshake of an agent with the node
// listener's configuration, both sides in this process over loopback (a new
// TCP connection each): full (client certificate sent and verified both
// ways) and resumed from a ticket of sessionTickets. ns/op includes the TCP
// connection; with -cpuprofile, the time under
// serverHandshakeStateTLS13.handshake and clientHandshakeStateTLS13.handshake
// is each side's CPU (docs/performance.md, "Reconnect storm: TLS session
// resumption, one dial, a handshake gate").
func BenchmarkNodeHandshake(b *testing.B) {
	p := terminaltest.NewPKI(b, "test CA", "node-a")
	_, caKey, err := pki.NewCA("test CA", time.Now())
	if err != nil {
		b.Fatal(err)
	}
	tk, err := newSessionTickets(caKey, time.Now)
	if err != nil {
		b.Fatal(err)
	}
	server := ticketServer(p, tk)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	for _, resume := range []bool{false, true} {
		name := map[bool]string{false: "full", true: "resumed"}[resume]
		b.Run(name, func(b *testing.B) {
			client := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.CA.Pool(), ServerName: "127.0.0.1",
				Certificates: []tls.Certificate{p.Node}}
			if resume {
				client.ClientSessionCache = tls.NewLRUClientSessionCache(1)
				handshakeOn(b, ln, server, client) // the ticket
			}
			b.ResetTimer()
			for range b.N {
				if cs := handshakeOn(b, ln, server, client); cs.DidResume != resume {
					b.Fatalf("resumed = %v", cs.DidResume)
				}
			}
		})
	}
}
