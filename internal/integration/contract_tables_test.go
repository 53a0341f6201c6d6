package integration

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/server"
	"github.com/drover-dev/drover/internal/node/agent"
	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/node/runtime/docker"
	"github.com/drover-dev/drover/internal/node/runtime/firecracker"
	"github.com/drover-dev/drover/internal/node/runtime/qemu"
	"github.com/drover-dev/drover/internal/node/slicevm"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/task"
	"github.com/drover-dev/drover/internal/wire/terminal"
)

// contractSections renders every generated section of docs/contract.md
// from the code's tables; the meanings of names the code does not
// describe itself are in contract_meanings_test.go.
func contractSections(t *testing.T, opRoutes []server.Route) map[string]string {
	return map[string]string{
		"node-routes":       nodeRoutesSection(t),
		"operator-routes":   operatorRoutesSection(t, opRoutes),
		"task-types":        taskTypesSection(t),
		"instance-phases":   mdTable([]string{"phase", "meaning"}, describe(t, "instance phase", constsOfType(t, "../wire/api", "InstancePhase"), instancePhaseMeaning())),
		"reason-codes":      reasonCodesSection(t),
		"host-statuses":     mdTable([]string{"status", "meaning"}, describe(t, "host status", constsOfType(t, "../wire/api", "HostStatus"), hostStatusMeaning())),
		"task-states":       mdTable([]string{"state", "meaning"}, describe(t, "task state", constsOfType(t, "../wire/api", "TaskState"), taskStateMeaning())),
		"allocation-states": mdTable([]string{"state", "meaning"}, describe(t, "allocation state", constsOfType(t, "../wire/api", "AllocationState"), allocationStateMeaning())),
		"terminal-states":   terminalStatesSection(t),
		"terminal-codes":    terminalCodesSection(t),
		"close-codes":       closeCodesSection(),
		"vm-phases":         vmPhasesSection(t),
		"agent-config":      agentConfigSection(),
		"signals":           signalsSection(),
		"preflight-hops":    preflightHopsSection(),
	}
}

// nodeRoutesSection renders the node API table (nodeapi.Routes).
func nodeRoutesSection(t *testing.T) string {
	meaning := nodeRouteMeaning()
	var rows [][]string
	var names []string
	for _, r := range nodeapi.Routes() {
		names = append(names, r.Name)
		m, ok := meaning[r.Name]
		if !ok {
			t.Errorf("node route %s has no meaning in contract_meanings_test.go", r.Name)
		}
		auth := map[nodeapi.Auth]string{nodeapi.AuthBootstrapToken: "none (TLS; the bootstrap token in the body)",
			nodeapi.AuthNodeCert: "mTLS node cert"}[r.Auth]
		if auth == "" {
			t.Errorf("node route %s: auth %s has no wording", r.Name, r.Auth)
		}
		body := func(rt reflect.Type) string {
			if rt == nil {
				return "none"
			}
			return code(rt.String())
		}
		resp := body(r.Response)
		if r.Stream {
			resp = "WebSocket stream"
		}
		rows = append(rows, []string{r.Method, code(r.Pattern), auth, body(r.Request), resp, m})
	}
	for n := range meaning {
		if !slices.Contains(names, n) {
			t.Errorf("contract_meanings_test.go describes node route %s, which nodeapi.Routes does not have", n)
		}
	}
	return mdTable([]string{"method", "path", "auth", "request", "response", "meaning"}, rows)
}

func operatorRoutesSection(t *testing.T, routes []server.Route) string {
	meaning := operatorRouteMeaning()
	var rows [][]string
	var keys []string
	for _, r := range routes {
		key := r.Method + " " + r.Path
		keys = append(keys, key)
		m, ok := meaning[key]
		if !ok {
			t.Errorf("operator route %s has no meaning in contract_meanings_test.go", key)
		}
		auth := "role " + r.Auth
		if r.Auth == "none" {
			auth = "none"
		}
		rows = append(rows, []string{r.Method, code(r.Path), auth, m})
	}
	for k := range meaning {
		if !slices.Contains(keys, k) {
			t.Errorf("contract_meanings_test.go describes operator route %s, which the server does not serve", k)
		}
	}
	return mdTable([]string{"method", "path", "auth", "meaning"}, rows)
}

func taskTypesSection(t *testing.T) string {
	var rows [][]string
	specs := task.Builtin()
	slices.SortFunc(specs, func(a, b task.Spec) int { return strings.Compare(a.Type, b.Type) })
	for _, s := range specs {
		if s.Params == nil || reflect.TypeOf(s.Params).Kind() != reflect.Struct {
			t.Errorf("task type %s: Spec.Params must be its params struct's zero value", s.Type)
			continue
		}
		enqueue := "yes"
		if s.Internal {
			enqueue = "no (control plane only)"
		}
		rows = append(rows, []string{code(s.Type), s.Meaning, paramsSummary(s.Params), s.Timeout.String(), s.Lease().String(), enqueue})
	}
	return mdTable([]string{"type", "meaning", "params (`?` optional)", "handler timeout", "server lease", "operators may enqueue"}, rows)
}

// paramsSummary lists a params struct's JSON fields, "?" marking the
// optional (omitempty) ones; "none" for a struct without fields.
func paramsSummary(p any) string {
	rt := reflect.TypeOf(p)
	var names []string
	for i := range rt.NumField() {
		tag := rt.Field(i).Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" || name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",omitempty,") {
			name += "?"
		}
		names = append(names, code(name))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func reasonCodesSection(t *testing.T) string {
	names := constsOfType(t, "../wire/api", "ReasonCode")
	var listed []string
	for _, c := range api.ReasonCodes() {
		listed = append(listed, string(c))
	}
	if !slices.Equal(names, listed) {
		t.Errorf("api.ReasonCodes() = %v, but the ReasonCode constants are %v", listed, names)
	}
	return mdTable([]string{"reason code", "meaning"}, describe(t, "reason code", names, reasonCodeMeaning()))
}

func terminalStatesSection(t *testing.T) string {
	names := constsOfType(t, "../wire/terminal", "State")
	var listed []string
	for _, s := range terminal.States() {
		listed = append(listed, string(s))
	}
	if !slices.Equal(names, listed) {
		t.Errorf("terminal.States() = %v, but the State constants are %v", listed, names)
	}
	return mdTable([]string{"state", "meaning"}, describe(t, "terminal readiness state", names, terminalStateMeaning()))
}

func terminalCodesSection(t *testing.T) string {
	names := constsOfType(t, "../wire/terminal", "ErrorCode")
	var rows [][]string
	var listed []string
	for _, c := range terminal.ErrorCodes() {
		listed = append(listed, string(c))
		retry := "no"
		if terminal.Retryable(c) {
			retry = "yes"
		}
		rows = append(rows, []string{code(string(c)), strconv.Itoa(terminal.CloseCode(c)), retry, terminal.RecoveryText(c)})
	}
	if !slices.Equal(names, listed) {
		t.Errorf("terminal.ErrorCodes() = %v, but the ErrorCode constants are %v", listed, names)
	}
	return mdTable([]string{"error code", "close code", "retryable", "recovery text (shown to the user)"}, rows)
}

// closeCodesSection groups the error codes by WebSocket close code.
func closeCodesSection() string {
	byClose := map[int][]string{terminal.CloseUnknown: {"any code this version does not know"}}
	for _, c := range terminal.ErrorCodes() {
		n := terminal.CloseCode(c)
		byClose[n] = append(byClose[n], code(string(c)))
	}
	var closes []int
	for n := range byClose {
		closes = append(closes, n)
	}
	slices.Sort(closes)
	var rows [][]string
	for _, n := range closes {
		rows = append(rows, []string{strconv.Itoa(n), strings.Join(byClose[n], ", ")})
	}
	return mdTable([]string{"close code", "error codes"}, rows)
}

func vmPhasesSection(t *testing.T) string {
	meaning := vmPhaseMeaning()
	var rows [][]string
	add := func(kind string, names ...string) {
		for _, n := range names {
			m, ok := meaning[n]
			if !ok {
				t.Errorf("slice VM phase %q has no meaning in contract_meanings_test.go", n)
			}
			rows = append(rows, []string{kind, code(n), m})
		}
	}
	add("check", slicevm.PhaseDeviceCheck)
	for i, p := range slicevm.ProvisionPhases() {
		add(fmt.Sprintf("provision %d", i+1), p)
	}
	add("cleanup", slicevm.CleanupVM, slicevm.CleanupDHCP, slicevm.CleanupTelemetry, slicevm.CleanupLeases, slicevm.CleanupCloudInitDir)
	add("release", slicevm.ReleaseShutdown, slicevm.ReleaseUndefine, slicevm.ReleaseVFIORebind, slicevm.ReleaseRemoveCloudInitDir,
		slicevm.ReleaseDropDHCP, slicevm.ReleaseWipe, slicevm.ReleaseLeases, slicevm.ReleaseUnregisterTelemetry)
	// Every Phase*, Cleanup* and Release* constant of the package is listed.
	all := constsWhere(t, "../node/slicevm", func(name, typ string) bool {
		return typ == "" && (strings.HasPrefix(name, "Phase") || strings.HasPrefix(name, "Cleanup") || strings.HasPrefix(name, "Release"))
	})
	for _, n := range all {
		if _, ok := meaning[n]; !ok {
			t.Errorf("slicevm declares phase %q, which docs/contract.md does not list", n)
		}
	}
	if len(rows) != len(meaning) {
		t.Errorf("contract_meanings_test.go describes %d slice VM phases, the table lists %d", len(meaning), len(rows))
	}
	return mdTable([]string{"step", "phase", "meaning"}, rows)
}

func agentConfigSection() string {
	var rows [][]string
	// drover-agent's registry (cmd/drover-agent): its runtimes' own keys
	// are part of the agent's contract.
	for _, k := range agent.ConfigKeys(runtime.Registry{qemu.Name: qemu.Entry(), docker.Name: docker.Entry(), firecracker.Name: firecracker.Entry()}) {
		flagName := k.Flag
		if flagName != "" {
			flagName = code(flagName)
		}
		rows = append(rows, []string{code(k.Key), flagName, k.Usage})
	}
	return mdTable([]string{"key", "flag", "meaning (the flag's usage)"}, rows)
}
