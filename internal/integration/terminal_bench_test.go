package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/node/termnode"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
	"github.com/drover-dev/drover/internal/wire/terminal/terminaltest"
)

// Browser terminal benchmarks (issue 5). Every variant drives the same
// thing, `cat` on a PTY in raw mode without echo, from the user's side:
//
//   - pty: a PTY this process opened (creack/pty, /bin/sh -c), no network;
//   - node: the node leg alone: termnode's PTY (a login shell) and its mTLS
//     WebSocket to a stub gateway in this process that the benchmark reads
//     directly;
//   - gateway: the whole chain: a browser WebSocket to the control plane's
//     gateway (loopback, plain HTTP as in the other integration tests),
//     which splices it to the node's mTLS stream; the session is recorded
//     as in production (gateway-norec: without the recording). The node
//     side is termnode.Manager, the agent's terminal code, run for a
//     scripted node (enrolled, heartbeating, claiming terminal.open and
//     dialing with its own certificate); gateway-agent is the same with the
//     whole agent in this process instead (its heap counts too);
//   - ssh: `ssh -tt` to a throwaway sshd on loopback (Debian's
//     openssh-server, its own config, keys and port).
//
// The latency the gateway adds is gateway − pty (the whole Drover chain) or
// gateway − node (the gateway hop alone: browser leg plus splice).
//
//	go test -run '^$' -bench 'BenchmarkTerminalEchoRTT' -benchtime 5s ./internal/integration/
//	go test -run '^$' -bench 'BenchmarkTerminalThroughput' -benchtime 3x ./internal/integration/
//
// All variants but pty need root: they create a throwaway user (useradd,
// userdel) whose shells they start, and sshd runs in a private mount
// namespace (unshare) so that its privilege separation directory /run/sshd
// exists there only. They skip without root or the tools, and fail instead
// under CI=true.

// Remote commands. The marker is typed as RE""ADY so that the echo of the
// typed line does not contain it; it is printed without a newline, after
// stty took effect, and nothing is printed after it.
const (
	benchMarker  = "READY"
	benchEchoCmd = `stty raw -echo; printf RE""ADY; exec cat`
	// benchBulkCmd answers every line n with n bytes 'x' and one 'E'.
	benchBulkCmd = `stty raw -echo; printf RE""ADY; while read -r n; do head -c "$n" /dev/zero | tr '\000' x; printf E; done`
)

// BenchmarkTerminalEchoRTT measures one keystroke's round trip: one byte
// written on the user's side, the same byte read back from cat.
func BenchmarkTerminalEchoRTT(b *testing.B) {
	for _, v := range benchVariants() {
		b.Run(v.name, func(b *testing.B) {
			s := v.open(b, benchEchoCmd)
			benchEcho(b, s)
		})
	}
}

// BenchmarkTerminalThroughput measures output throughput: the shell writes
// n bytes, the user's side reads them all (MB/s is 10^6 bytes per second).
// The WebSocket variants report the mean stdout frame size. The in-process
// variants also report, for this process (gateway, termnode and the
// benchmark's own client together: an upper bound for the gateway), the
// peak growth of the heap in use (runtime/metrics, the same figure as
// MemStats.HeapInuse) and of the memory mapped from the OS (MemStats.Sys)
// over a collected baseline, the heap still in use after the run, the bytes
// allocated per byte delivered and the CPU time per MB; at two sizes, to
// show that memory does not grow with n.
func BenchmarkTerminalThroughput(b *testing.B) {
	for _, v := range benchVariants() {
		for _, n := range []int{64 << 20, 256 << 20} {
			b.Run(fmt.Sprintf("%s/%dMiB", v.name, n>>20), func(b *testing.B) {
				s := v.open(b, benchBulkCmd)
				benchBulk(b, s, n, v.inProcess)
			})
		}
	}
}

// benchVariant opens a stream running cmd.
type benchVariant struct {
	name      string
	inProcess bool // the chain's memory is this process's
	open      func(b *testing.B, cmd string) io.ReadWriter
}

func benchVariants() []benchVariant {
	return []benchVariant{
		{"pty", false, openDirectPTY},
		{"node", true, openNodeLeg},
		{"gateway", true, func(b *testing.B, cmd string) io.ReadWriter { return openGateway(b, cmd, true, scriptedTermnode) }},
		{"gateway-norec", true, func(b *testing.B, cmd string) io.ReadWriter { return openGateway(b, cmd, false, scriptedTermnode) }},
		{"gateway-agent", true, func(b *testing.B, cmd string) io.ReadWriter { return openGateway(b, cmd, true, inProcessAgent) }},
		{"ssh", false, openSSH},
	}
}

// benchEcho runs the round trips and reports their p50, p99 and p99.9.
func benchEcho(b *testing.B, s io.ReadWriter) {
	one, got := []byte{0}, []byte{0}
	rtt := func(i int) time.Duration {
		one[0] = 'a' + byte(i%26)
		start := time.Now()
		if _, err := s.Write(one); err != nil {
			b.Fatalf("write: %v", err)
		}
		if _, err := io.ReadFull(s, got); err != nil {
			b.Fatalf("read: %v", err)
		}
		d := time.Since(start)
		if got[0] != one[0] {
			b.Fatalf("echoed %q, want %q", got, one)
		}
		return d
	}
	for i := range 200 { // warm up: connections, caches, the scheduler
		rtt(i)
	}
	lat := make([]time.Duration, 0, 1<<16)
	for i := 0; b.Loop(); i++ {
		lat = append(lat, rtt(i))
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(float64(len(lat))*p))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(0.50), "p50-us")
	b.ReportMetric(q(0.99), "p99-us")
	b.ReportMetric(q(0.999), "p99.9-us")
}

// benchBulk asks for n bytes per iteration and reads them all.
func benchBulk(b *testing.B, s io.ReadWriter, n int, mem bool) {
	line := []byte(strconv.Itoa(n) + "\n")
	buf := make([]byte, 64<<10)
	fetch := func() {
		if _, err := s.Write(line); err != nil {
			b.Fatalf("write: %v", err)
		}
		xs, total, last := 0, 0, byte(0)
		for total < n+1 {
			k, err := s.Read(buf)
			if err != nil {
				b.Fatalf("read after %d of %d bytes: %v", total, n+1, err)
			}
			xs += bytes.Count(buf[:k], []byte{'x'})
			total += k
			if k > 0 {
				last = buf[k-1]
			}
		}
		if total != n+1 || xs != n || last != 'E' {
			b.Fatalf("read %d bytes (%d x, last %q), want %d x and E", total, xs, last, n)
		}
	}
	fetch() // warm up
	var m *memSampler
	if mem {
		m = startMemSampler()
	}
	b.SetBytes(int64(n))
	iters := 0
	for b.Loop() {
		fetch()
		iters++
	}
	if ws, ok := s.(*wsStream); ok && ws.frames > 0 {
		b.ReportMetric(float64(ws.bytes)/float64(ws.frames), "B/frame")
	}
	if m != nil {
		peak, sys, retained, allocs, cpu := m.stop()
		b.ReportMetric(peak/(1<<20), "heap-peak-growth-MiB")
		b.ReportMetric(sys/(1<<20), "sys-growth-MiB")
		b.ReportMetric(retained/(1<<20), "heap-retained-MiB")
		b.ReportMetric(allocs/float64(iters*n), "alloc-B/B")
		b.ReportMetric(float64(cpu.Microseconds())/(float64(iters*n)/1e6), "cpu-us/MB")
	}
}

// memSampler samples the heap in use (objects + unused span space) and the
// memory mapped from the OS every 5 ms, without stopping the world.
type memSampler struct {
	base, baseSys float64
	baseAllocs    float64
	baseCPU       time.Duration
	peak, peakSys float64
	done          chan struct{}
	wg            sync.WaitGroup
}

var memSamples = []string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/unused:bytes",
	"/memory/classes/total:bytes", "/gc/heap/allocs:bytes"}

// readMem returns the heap in use, the memory mapped from the OS and the
// bytes allocated so far.
func readMem() (heap, sys, allocs float64) {
	s := make([]metrics.Sample, len(memSamples))
	for i, n := range memSamples {
		s[i].Name = n
	}
	metrics.Read(s)
	return float64(s[0].Value.Uint64() + s[1].Value.Uint64()), float64(s[2].Value.Uint64()), float64(s[3].Value.Uint64())
}

func startMemSampler() *memSampler {
	runtime.GC()
	m := &memSampler{done: make(chan struct{})}
	m.base, m.baseSys, m.baseAllocs = readMem()
	m.baseCPU = processCPU()
	m.peak, m.peakSys = m.base, m.baseSys
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-t.C:
			}
			h, s, _ := readMem()
			m.peak, m.peakSys = max(m.peak, h), max(m.peakSys, s)
		}
	}()
	return m
}

// stop returns the peak heap and mapped-memory growth over the baseline,
// the heap still in use after a collection, the bytes allocated and the
// CPU time this process used.
func (m *memSampler) stop() (peak, sys, retained, allocs float64, cpu time.Duration) {
	close(m.done)
	m.wg.Wait()
	cpu = processCPU() - m.baseCPU
	_, _, allocs = readMem()
	runtime.GC()
	after, _, _ := readMem()
	return m.peak - m.base, m.peakSys - m.baseSys, after - m.base, allocs - m.baseAllocs, cpu
}

// processCPU is the user and system CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// awaitMarker reads until the marker and fails on anything after it.
func awaitMarker(b *testing.B, s io.Reader, abort func(), within time.Duration) {
	b.Helper()
	t := time.AfterFunc(within, abort)
	defer t.Stop()
	var seen []byte
	buf := make([]byte, 4096)
	for {
		n, err := s.Read(buf)
		seen = append(seen, buf[:n]...)
		if i := bytes.Index(seen, []byte(benchMarker)); i >= 0 {
			if rest := seen[i+len(benchMarker):]; len(rest) > 0 {
				b.Fatalf("output after the marker: %q", rest)
			}
			return
		}
		if err != nil {
			b.Fatalf("waiting for the marker: %v; output %q", err, seen)
		}
	}
}

// openDirectPTY runs cmd under sh on a PTY this process holds.
func openDirectPTY(b *testing.B, cmd string) io.ReadWriter {
	c := exec.Command("/bin/sh", "-c", cmd)
	f, err := pty.StartWithSize(c, &pty.Winsize{Cols: 80, Rows: 24})
	if err != nil {
		b.Fatalf("start PTY: %v", err)
	}
	b.Cleanup(func() {
		_ = c.Process.Kill()
		_ = c.Wait()
		f.Close()
	})
	awaitMarker(b, f, func() { f.Close() }, 10*time.Second)
	return f
}

// wsStream is the user's side of a terminal WebSocket: stdin frames out,
// stdout frames in. Control frames before ready are skipped; exit and error
// end the stream.
type wsStream struct {
	c     *websocket.Conn
	buf   []byte // the message being read, reused
	rest  []byte // stdout not yet returned
	ready bool
	// stdout frames and their bytes so far
	frames, bytes int
}

func (s *wsStream) Write(p []byte) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.c.Write(ctx, websocket.MessageBinary, terminal.Encode(terminal.ChanStdin, p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *wsStream) Read(p []byte) (int, error) {
	for len(s.rest) == 0 {
		if err := s.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.rest)
	s.rest = s.rest[n:]
	return n, nil
}

// next reads one message into the reused buffer.
func (s *wsStream) next() error {
	_, r, err := s.c.Reader(context.Background())
	if err != nil {
		return err
	}
	s.buf = s.buf[:0]
	for {
		if len(s.buf) == cap(s.buf) {
			s.buf = slices.Grow(s.buf, 64<<10)
		}
		n, err := r.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	ch, payload, err := terminal.Decode(s.buf)
	if err != nil {
		return err
	}
	switch ch {
	case terminal.ChanStdout:
		s.rest = payload
		s.frames++
		s.bytes += len(payload)
	case terminal.ChanControl:
		c, err := terminal.DecodeControl(payload)
		if err != nil {
			return err
		}
		switch c.Type {
		case terminal.TypeReady:
			s.ready = true
		case terminal.TypeExit:
			return io.EOF
		case terminal.TypeError:
			return fmt.Errorf("terminal error %s: %s", c.Error, c.Message)
		}
	default:
		return fmt.Errorf("unexpected frame on %s", ch)
	}
	return nil
}

// waitReady reads until the ready control frame.
func (s *wsStream) waitReady(b *testing.B, within time.Duration) {
	b.Helper()
	t := time.AfterFunc(within, func() { s.c.CloseNow() })
	defer t.Stop()
	for !s.ready {
		if err := s.next(); err != nil {
			b.Fatalf("waiting for ready: %v", err)
		}
		if len(s.rest) > 0 {
			b.Fatalf("stdout before ready: %q", s.rest)
		}
	}
}

// benchOpenParams are terminal.open params for user's shell.
func benchOpenParams(sessionID, nonce, user string) task.TerminalOpenParams {
	return task.TerminalOpenParams{SessionID: sessionID, AllocationID: "alc_bench", Nonce: nonce,
		Mode: task.TerminalModePTY, Username: user, Cols: 80, Rows: 24, MaxLifetime: api.Duration(time.Hour)}
}

// needRoot skips (fails under CI=true) when not root: the benchmarks create
// a user and start shells as it.
func needRoot(b *testing.B, what string) {
	b.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := what + " needs root (it creates a throwaway user with useradd and starts shells as it)"
	if os.Getenv("CI") == "true" {
		b.Fatal(msg)
	}
	b.Skip(msg)
}

// benchUser creates a throwaway user with bash as its login shell (the
// PTY's user: terminal.open refuses root) and deletes it at cleanup, so
// every variant runs the same fresh shell start-up files. Its password is
// "*" (no password login) rather than useradd's "!", which sshd without
// PAM treats as a locked account that may not log in at all.
func benchUser(b *testing.B) string {
	b.Helper()
	needRoot(b, "this benchmark")
	skipWithout(b, "useradd", "userdel")
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		b.Fatal(err)
	}
	name := "dbench" + hex.EncodeToString(rnd[:])
	if out, err := exec.Command("useradd", "-m", "-s", "/bin/bash", "-p", "*", name).CombinedOutput(); err != nil {
		b.Fatalf("useradd: %v: %s", err, out)
	}
	b.Cleanup(func() {
		if out, err := exec.Command("userdel", "-r", name).CombinedOutput(); err != nil {
			b.Logf("userdel %s: %v: %s", name, err, out)
		}
	})
	return name
}

// openNodeLeg opens a termnode session to the node-facing stream route of
// a stub gateway in this process (terminaltest, raw: the benchmark reads
// the stream itself) and returns the stub's end of the node stream.
func openNodeLeg(b *testing.B, cmd string) io.ReadWriter {
	user := benchUser(b)
	g := terminaltest.New(b, terminaltest.Options{Raw: true, ReadLimit: 4 << 20})
	pool := x509.NewCertPool()
	pool.AddCert(g.Server.Certificate())
	mgr := termnode.New(termnode.Config{NodeID: "bench-node", BaseURL: g.URL(), Logger: testLogger(b),
		TLSConfig: func() *tls.Config { return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13} }})
	b.Cleanup(mgr.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := mgr.Open(ctx, benchOpenParams("bench", strings.Repeat("ab", 32), user), "", nil); err != nil {
		b.Fatalf("termnode open: %v", err)
	}
	s := &wsStream{c: g.Stream(10 * time.Second).Conn}
	b.Cleanup(func() { s.c.CloseNow() })
	s.waitReady(b, 10*time.Second)
	if _, err := s.Write([]byte(cmd + "\n")); err != nil {
		b.Fatal(err)
	}
	awaitMarker(b, s, func() { s.c.CloseNow() }, 10*time.Second)
	return s
}

// gatewayNode is how the gateway variants' node side runs.
type gatewayNode int

const (
	// scriptedTermnode: termnode.Manager for a scripted node (enrolled,
	// heartbeating, claiming terminal.open, dialing the stream with its own
	// certificate and posting the result by hand).
	scriptedTermnode gatewayNode = iota
	// inProcessAgent: the whole agent, in this process, whose terminal.open
	// handler runs termnode.
	inProcessAgent
)

// openGateway opens a browser terminal through the control plane's gateway
// to a PTY that termnode starts for node, records it when record is set,
// and types cmd.
func openGateway(b *testing.B, cmd string, record bool, node gatewayNode) io.ReadWriter {
	user := benchUser(b)
	recDir := ""
	if record {
		recDir = b.TempDir()
	}
	e := startEnv(b, openSQLite(b), func(c *server.Config) {
		c.Terminal = server.TerminalConfig{RecordingDir: recDir}
	})
	var open func(ctx context.Context) // serves the terminal.open task
	switch node {
	case inProcessAgent:
		bt := e.createHost("bench-node")
		e.startAgent("bench-node", bt.Token, agentOpts{})
		e.waitHostStatus("bench-node", api.HostHealthy, 30*time.Second)
		open = func(context.Context) {}
	default:
		sn := e.scriptedNode("bench-node")
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(e.srv.CAPEM())
		mgr := termnode.New(termnode.Config{NodeID: "bench-node", BaseURL: e.nodeURL, Logger: testLogger(b),
			TLSConfig: func() *tls.Config {
				return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{sn.cert}, MinVersion: tls.VersionTLS13}
			}})
		b.Cleanup(mgr.Close)
		open = func(ctx context.Context) {
			claims := sn.claim(10 * time.Second)
			res, err := mgr.Open(ctx, openParams(b, claims), claims.CorrelationID, nil)
			if err != nil {
				b.Fatalf("termnode open: %v", err)
			}
			out, _ := json.Marshal(res)
			sn.result(claims.TaskID, api.TaskResult{Status: api.ResultSucceeded, Output: out})
		}
	}
	e.activeAllocation("alc_bench", "bench-node", user)

	tok := e.mintToken("alc_bench", api.TerminalTokenRequest{Cols: 80, Rows: 24})
	protos, err := terminal.ClientProtocols(tok.Token)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.opURL, "http")+"/api/v1/terminal?allocation_id=alc_bench",
		&websocket.DialOptions{Subprotocols: protos, HTTPHeader: http.Header{"Origin": {e.opURL}}})
	if err != nil {
		b.Fatalf("dial the gateway: %v", err)
	}
	c.SetReadLimit(4 << 20)
	s := &wsStream{c: c}
	b.Cleanup(func() { c.CloseNow() })
	open(ctx)
	s.waitReady(b, 20*time.Second)
	if _, err := s.Write([]byte(cmd + "\n")); err != nil {
		b.Fatal(err)
	}
	awaitMarker(b, s, func() { c.CloseNow() }, 10*time.Second)
	return s
}
