package integration

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/testutil"
	"github.com/drover-dev/drover/internal/wire/signal"
)

// preflightRunbookPath is the operator runbook generated from the signal
// table (internal/wire/signal) the agent, the control plane and preflight use.
const preflightRunbookPath = "../../docs/runbooks/preflight.md"

// TestPreflightRunbookDoc keeps docs/runbooks/preflight.md's tables in step
// with internal/wire/signal (-update rewrites them).
func TestPreflightRunbookDoc(t *testing.T) {
	raw, err := os.ReadFile(preflightRunbookPath)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fillSections(string(raw), runbookSections())
	if err != nil {
		t.Fatal(err)
	}
	if *updateContract {
		testutil.CheckGolden(t, preflightRunbookPath, []byte(got), true)
		return
	}
	if got != string(raw) {
		t.Errorf("docs/runbooks/preflight.md is not what internal/wire/signal says (go test ./internal/integration -run TestPreflightRunbookDoc -update rewrites it):\n%s",
			testutil.LineDiff(string(raw), got))
	}
}

func runbookSections() map[string]string {
	return map[string]string{
		"hops":             hopsTable(),
		"signals-node":     signalMatrix(signal.DomainNode),
		"signals-terminal": signalMatrix(signal.DomainTerminal),
		"signals-control":  signalMatrix(signal.DomainControlPlane),
	}
}

func hopsTable() string {
	var rows [][]string
	for i, h := range signal.Hops() {
		where := "control plane / operator"
		if h.OnNode {
			where = "node (`drover-agent preflight`)"
		}
		var sigs []string
		for _, s := range signal.Signals() {
			if slices.Contains(s.Hops, h.Hop) {
				sigs = append(sigs, code(string(s.Name)))
			}
		}
		rows = append(rows, []string{strconv.Itoa(i + 1), code(string(h.Hop)), h.Checks, where, strings.Join(sigs, ", ")})
	}
	return mdTable([]string{"#", "hop", "checks", "runs on", "signals it reports"}, rows)
}

func signalMatrix(d signal.Domain) string {
	var rows [][]string
	for _, s := range signal.Signals() {
		if s.Domain != d {
			continue
		}
		var hops []string
		for _, h := range s.Hops {
			hops = append(hops, code(string(h)))
		}
		status := "—"
		if s.HostStatus != "" {
			status = code(string(s.HostStatus))
		}
		rows = append(rows, []string{s.Symptom, s.Check, s.Owner, s.Recovery, code(string(s.Name)), strings.Join(hops, ", "), status})
	}
	return mdTable([]string{"symptom", "fast preflight", "owner", "recovery", "signal", "failed hop", "host status"}, rows)
}

func signalsSection() string {
	var rows [][]string
	for _, s := range signal.Signals() {
		rows = append(rows, []string{code(string(s.Name)), string(s.Domain), s.Symptom})
	}
	return mdTable([]string{"signal", "domain", "meaning"}, rows)
}

func preflightHopsSection() string {
	var rows [][]string
	for _, h := range signal.Hops() {
		rows = append(rows, []string{code(string(h.Hop)), h.Checks})
	}
	return mdTable([]string{"hop", "checks"}, rows)
}
