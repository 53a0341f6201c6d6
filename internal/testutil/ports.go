package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// FreePort is a TCP port that nothing listens on now, on any address, for
// a server another process binds later (a container, a VM's forward, a
// child). It lies below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), so the outgoing connections made
// meanwhile (an image pull, a registry, the test's own clients) cannot
// take it as their local port, as they can a port from Listen(":0"): that
// made a later bind fail with EADDRINUSE now and then.
func FreePort(t testing.TB) int {
	t.Helper()
	low := ephemeralLow()
	for range 200 {
		p := 10000 + rand.IntN(low-10000)
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p
	}
	t.Fatalf("no free TCP port in 10000-%d", low-1)
	return 0
}

// ephemeralLow is the first port of the ephemeral range (32768 when it
// cannot be read, the Linux default).
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var hi int
		if n, _ := fmt.Sscan(string(b), &low, &hi); n != 2 || low <= 11000 {
			low = 32768
		}
	}
	return low
}
