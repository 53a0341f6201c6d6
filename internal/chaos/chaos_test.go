package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// scenario is one row of the chaos matrix.
type scenario struct {
	name string
	// injection says in a few words how the fault is made (the report).
	injection string
	// hop and sig are the expected classification; alt lists other hops
	// the signal table allows for sig, when the row's honest injection
	// surfaces it there (the observed hop is reported either way).
	hop signal.Hop
	sig signal.Name
	alt []signal.Hop
	// detail, when set, is a substring of the failed hop's detail.
	detail string
	// terminal rows open a real session (allocation, --run-ws-smoke).
	terminal bool
	// noFault rows expect every run to pass (a change the system absorbs).
	noFault bool
	// storeDown rows break the control plane's own store: the report
	// cannot be stored, so the evidence is the correlation id in the API's
	// error envelope and in the control plane's log.
	storeDown bool
	opts      clusterOpts
	// setup runs before the agent starts; inject makes the fault; args are
	// extra preflight flags while the fault holds; repair undoes it.
	setup  func(c *cluster, s *state)
	inject func(c *cluster, s *state)
	args   func(c *cluster, s *state) []string
	repair func(c *cluster, s *state)
	// during, when set, runs after the fault was named and before the
	// repair; what it returns is added to the observed column.
	during func(c *cluster, s *state) string
	// check, when set, asserts more after recovery.
	check func(c *cluster, s *state)
	// limit bounds injection → the start of the run that names the fault.
	limit time.Duration
}

// state carries what a row's steps share (no package-level state).
type state struct {
	agentBin string
	vals     map[string]string
}

// result is one row of the printed table.
type result struct {
	name, injection, expected, observed, cid string
	detectBy                                 string // preflight or host status
	detect, recover                          time.Duration
	ran, ok                                  bool
}

func TestChaosMatrix(t *testing.T) {
	requireRoot(t)
	b := buildBins(t)
	var results []result
	for _, sc := range scenarios() {
		res := result{name: sc.name, injection: sc.injection, expected: string(sc.hop) + " / " + string(sc.sig)}
		if sc.noFault {
			res.expected = "no failure"
		}
		t.Run(sc.name, func(t *testing.T) {
			res.ran = true
			runScenario(t, b, sc, &res)
			res.ok = !t.Failed()
		})
		if res.ran {
			results = append(results, res)
		}
	}
	writeReport(t, results)
}

func runScenario(t *testing.T, b bins, sc scenario, res *result) {
	c := startCluster(t, b, sc.opts)
	s := &state{agentBin: b.agent, vals: map[string]string{}}
	if sc.setup != nil {
		sc.setup(c, s)
	}
	c.startAgent()
	if sc.terminal {
		c.createAllocation(fmt.Sprintf("chx%d", time.Now().UnixNano()%1_000_000_000))
	}
	if r := c.preflight(b.agent); !r.rep.Classification.OK {
		t.Fatalf("baseline preflight failed: %+v: %s\n%s", r.rep.Classification, r.hopDetail(), r.stderr)
	}
	if sc.noFault {
		sc.inject(c, s)
		res.observed = "every run passed"
		sc.check(c, s)
		return
	}
	// The fault holds once inject returns (a clone enrolled, a process
	// exited, an agent restarted); time to detect counts from there. The
	// system may name it while inject still runs (the superseded agent's
	// heartbeats are refused while the clone is being stopped): a host
	// failure recorded since inject began counts, as detected at once.
	begun := time.Now().Truncate(time.Millisecond) // the store keeps milliseconds
	sc.inject(c, s)
	injected := time.Now()
	limit := sc.limit
	if limit == 0 {
		limit = 3 * heartbeat
	}
	var named pfRun
	for {
		var args []string
		if sc.args != nil {
			args = sc.args(c, s)
		}
		r := c.preflight(s.agentBin, args...)
		cl := r.rep.Classification
		t.Logf("detect run: ok=%v %s/%s: %s", cl.OK, cl.Hop, cl.Signal, r.hopDetail())
		if !cl.OK && cl.Signal == sc.sig && (cl.Hop == sc.hop || contains(sc.alt, cl.Hop)) {
			named = r
			break
		}
		if r.start.Sub(injected) > limit {
			res.observed = fmt.Sprintf("%s / %s", cl.Hop, cl.Signal)
			t.Fatalf("no run started within %s of the injection named %s at %s; last: ok=%v %s/%s %s\n%s",
				limit, sc.sig, sc.hop, cl.OK, cl.Hop, cl.Signal, r.hopDetail(), r.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Detected: when the preflight run that named the fault finished, or
	// earlier when the host status named it first: its last failure, whose
	// time the control plane keeps at the first occurrence while the same
	// failure persists. That is the system's own evidence; a run's start
	// also carries the harness's scheduling (a loaded CI machine).
	res.detect, res.detectBy = named.finish.Sub(injected), "preflight"
	start := named.start.Sub(injected)
	var h api.Host
	if st, raw := c.do(http.MethodGet, "/api/v1/hosts/"+c.hostID, nil); st == http.StatusOK && json.Unmarshal(raw, &h) == nil &&
		signal.Name(h.LastFailureSignal) == sc.sig && h.LastFailureAt != nil && !h.LastFailureAt.Before(begun) {
		if d := max(0, h.LastFailureAt.Sub(injected)); d < res.detect {
			res.detect, res.detectBy = d, "host status"
			start = min(start, d)
		}
	}
	// The bound is on when the naming began: the run's own probes take up
	// to their timeouts (a blackholed API takes --timeout to name).
	if start > limit {
		t.Errorf("the fault was first named by a run started or a status set %s after the injection, more than %s", start, limit)
	}
	res.cid = named.rep.CorrelationID
	cl := named.rep.Classification
	res.observed = fmt.Sprintf("%s / %s", cl.Hop, cl.Signal)
	if !strings.Contains(named.hopDetail(), sc.detail) {
		t.Errorf("failed hop's detail %q lacks %q", named.hopDetail(), sc.detail)
	}
	if cl.Owner == "" || cl.Recovery == "" {
		t.Errorf("classification without owner or recovery: %+v", cl)
	}
	t.Logf("named after %s (%s): %s", res.detect.Round(time.Millisecond), res.detectBy, named.hopDetail())
	if sc.storeDown {
		cid := named.rep.CorrelationID
		if !strings.Contains(named.hopDetail(), "correlation_id "+cid) || !c.cp.logHas(cid) {
			t.Errorf("the error envelope (%q) or the control plane log lacks %s", named.hopDetail(), cid)
		}
		sc.repair(c, s)
		c.recover(sc, s, res, time.Now())
		return
	}
	type evidence struct {
		summary  string
		problems []string
	}
	evc := make(chan evidence, 1)
	go func() {
		s, p := c.evidence(named.rep.CorrelationID)
		evc <- evidence{s, p}
	}()
	defer func() {
		ev := <-evc
		t.Logf("evidence of %s: %s", named.rep.CorrelationID, ev.summary)
		for _, p := range ev.problems {
			t.Error(p)
		}
	}()

	if sc.during != nil {
		res.observed += "; " + sc.during(c, s)
	}
	repaired := time.Now()
	sc.repair(c, s)
	c.recover(sc, s, res, repaired)
}

// recover reruns preflight after the repair until it passes (bounded).
func (c *cluster) recover(sc scenario, s *state, res *result, repaired time.Time) {
	t := c.t
	for i := 0; ; i++ {
		r := c.preflight(s.agentBin)
		if r.rep.Classification.OK {
			res.recover = r.finish.Sub(repaired)
			break
		}
		cl := r.rep.Classification
		if time.Since(repaired) > 45*time.Second {
			t.Fatalf("no passing preflight within 45s of the repair; last %s/%s: %s\nagent log:\n%s", cl.Hop, cl.Signal, r.hopDetail(), c.agentTail())
		}
		t.Logf("recovery run %d: %s/%s: %s", i, cl.Hop, cl.Signal, r.hopDetail())
		time.Sleep(300 * time.Millisecond)
	}
	if sc.check != nil {
		sc.check(c, s)
	}
}

func contains(hs []signal.Hop, h signal.Hop) bool {
	for _, x := range hs {
		if x == h {
			return true
		}
	}
	return false
}

// requireRoot skips without root (mounts, useradd, PTYs as other users)
// unless CI is set: then the run fails instead.
func requireRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("the chaos matrix needs root (CI runs as root)")
	}
	t.Skip("the chaos matrix needs root (useradd, tmpfs mounts, PTYs)")
}

// writeReport logs the table and writes it to $DROVER_CHAOS_REPORT.
func writeReport(t *testing.T, results []result) {
	var b strings.Builder
	b.WriteString("| Scenario | Injection | Expected hop / signal | Observed | Detect (by) | Recover | Result |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		ok := "pass"
		if !r.ok {
			ok = "FAIL"
		}
		detect := dur(r.detect)
		if r.detectBy != "" {
			if r.detect == 0 { // named while the injection ran
				detect = "0s"
			}
			detect += " (" + r.detectBy + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", r.name, r.injection, r.expected, r.observed,
			detect, dur(r.recover), ok)
	}
	t.Logf("chaos matrix:\n%s", b.String())
	if p := os.Getenv("DROVER_CHAOS_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Errorf("write %s: %v", p, err)
		}
	}
}

func dur(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}
