package accel

import (
	"encoding/json"
	"io"
	"os"
	"sync"
	"time"
)

// ChildEnv, set to "kvm", makes MaybeRunChild run the KVM proof and exit.
const ChildEnv = "DROVER_ACCEL_CHILD"

const (
	childDevEnv     = "DROVER_ACCEL_KVM_DEV"       // the KVM device to prove
	childTimeoutEnv = "DROVER_ACCEL_CHILD_TIMEOUT" // backstop: the child gives up on its own after this
	childBudgetEnv  = "DROVER_ACCEL_KVM_BUDGET"    // the guest's loops must be done within this
	childArg        = "drover-accel-child"         // makes a binary that forgot MaybeRunChild fail fast on its arguments
)

// MaybeRunChild turns this process into a KVM probe child when ChildEnv is
// set: it runs the probe guest, writes its verdict as one JSON line to
// stdout and exits. Otherwise it returns at once. The agent's main and every
// test binary that probes (TestMain) call it before anything else.
func MaybeRunChild() {
	mode := os.Getenv(ChildEnv)
	if mode == "" {
		return
	}
	backstop, err := time.ParseDuration(os.Getenv(childTimeoutEnv))
	if err != nil || backstop <= 0 {
		backstop = 30 * time.Second
	}
	budget, err := time.ParseDuration(os.Getenv(childBudgetEnv))
	if err != nil || budget <= 0 {
		budget = time.Second
	}
	os.Exit(runChild(mode, os.Getenv(childDevEnv), budget, backstop, os.Stdout))
}

// childLine is one line of the child's stdout: progress (Stage) or, last,
// the verdict (Done).
type childLine struct {
	Stage  string `json:"stage,omitempty"`
	Done   bool   `json:"done,omitempty"`
	Works  bool   `json:"works,omitempty"`
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// runChild runs the probe and returns the exit code. A guest whose loops do
// not finish within budget is too slow. A guest that hangs past backstop
// (the parent should have killed us by then) ends the process with a
// kvm_guest_hung verdict.
func runChild(mode, dev string, budget, backstop time.Duration, w io.Writer) int {
	var mu sync.Mutex
	done, last := false, "start"
	emit := func(l childLine) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		if l.Stage != "" {
			last = l.Stage
		}
		if l.Done && l.Reason == ReasonKVMGuestHung && l.Detail == "" {
			l.Detail = "the child's own backstop fired after " + backstop.String() + " in stage " + last
		}
		done = l.Done
		b, _ := json.Marshal(l)
		w.Write(append(b, '\n'))
	}
	if mode != KVM {
		emit(childLine{Done: true, Reason: ReasonKVMChildFailed, Detail: "unknown probe child mode " + mode})
		return 2
	}
	if dev == "" {
		dev = "/dev/kvm"
	}
	t := time.AfterFunc(backstop, func() {
		emit(childLine{Done: true, Reason: ReasonKVMGuestHung})
		os.Exit(3)
	})
	defer t.Stop()
	works, reason, detail := kvmProof(dev, budget, func(stage string) { emit(childLine{Stage: stage}) })
	emit(childLine{Done: true, Works: works, Reason: reason, Detail: detail})
	return 0
}
