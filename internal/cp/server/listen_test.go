package server

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestListen: Listen binds both addresses and writes the bound ports back,
// keeping the configured host; unset addresses get the defaults' hosts.
func TestListen(t *testing.T) {
	for _, tc := range []struct{ op, node, opHost, nodeHost string }{
		{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1", "127.0.0.1"},
		{"127.0.0.1:0", ":0", "127.0.0.1", ""},
	} {
		cfg := Config{OperatorAddr: tc.op, NodeAddr: tc.node}
		op, node, err := Listen(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			addr, host string
			ln         net.Listener
		}{{cfg.OperatorAddr, tc.opHost, op}, {cfg.NodeAddr, tc.nodeHost, node}} {
			host, port, err := net.SplitHostPort(c.addr)
			if err != nil || host != c.host || port != strconv.Itoa(c.ln.Addr().(*net.TCPAddr).Port) || port == "0" {
				t.Errorf("%s/%s: address %q, want host %q and the bound port of %s", tc.op, tc.node, c.addr, c.host, c.ln.Addr())
			}
		}
		op.Close()
		node.Close()
	}
	// A port in use is refused, naming the listener.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := Config{OperatorAddr: "127.0.0.1:0", NodeAddr: busy.Addr().String()}
	if _, _, err := Listen(&cfg); err == nil || !strings.Contains(err.Error(), "node listener "+busy.Addr().String()) {
		t.Fatalf("busy node port: %v", err)
	}
}
