package accel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// ChildCommand is the default Config.KVMChild: this executable, told by
// ChildEnv to prove the KVM device dev. A hung KVM_RUN blocks its thread in
// the kernel, so the proof runs in a process the Prober can kill after
// timeout. The guest's loops must be done within KVMBudget(timeout).
func ChildCommand(dev string, timeout time.Duration) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, childArg)
	cmd.Env = append(os.Environ(), ChildEnv+"="+KVM, childDevEnv+"="+dev,
		childBudgetEnv+"="+KVMBudget(timeout).String(),
		childTimeoutEnv+"="+(2*timeout+time.Second).String())
	return cmd, nil
}

// KVMBudget is how long the probe guest may take to run its loops: a second
// (hardware needs milliseconds), or half the timeout when that is shorter,
// so that a slow guest is reported as such before the Prober kills it.
func KVMBudget(timeout time.Duration) time.Duration { return min(time.Second, timeout/2) }

// syncBuffer is a bounded buffer safe to read while the child writes; each
// write pokes wrote.
type syncBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{}
}

const childOutputLimit = 64 << 10

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := childOutputLimit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	if b.wrote != nil {
		select {
		case b.wrote <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runKVMChild starts the probe child, kills it when Timeout passes without a
// verdict, and reads the verdict.
func (p *Prober) runKVMChild(ctx context.Context) Status {
	if os.Getenv(ChildEnv) != "" {
		return Status{Reason: ReasonKVMChildFailed, Detail: "a probe child does not start probe children"}
	}
	cmd, err := p.cfg.KVMChild()
	if err != nil {
		return Status{Reason: ReasonKVMChildFailed, Detail: "probe child: " + err.Error()}
	}
	stdout, stderr := syncBuffer{wrote: make(chan struct{}, 1)}, syncBuffer{}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, &stdout, &stderr
	cmd.WaitDelay = 500 * time.Millisecond
	if err := cmd.Start(); err != nil {
		return Status{Reason: ReasonKVMChildFailed, Detail: "probe child: " + err.Error()}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	timer := time.NewTimer(p.cfg.Timeout)
	defer timer.Stop()
	// reap kills the child and waits a little for it: a process stuck in the
	// kernel may not die at once, and its Wait goroutine reaps it whenever
	// it goes.
	reap := func() bool {
		cmd.Process.Kill()
		select {
		case <-exited:
			return true
		case <-time.After(500 * time.Millisecond):
			return false
		}
	}

wait:
	for {
		select {
		case <-stdout.wrote:
			// The verdict counts as soon as it is written; the child's exit
			// may lag (the race detector's, for one, sleeps a second).
			if v, _ := parseChild(stdout.String()); v != nil {
				reap()
				return Status{Works: v.Works, Reason: v.Reason, Detail: v.Detail}
			}
		case err := <-exited:
			v, stage := parseChild(stdout.String())
			if v != nil {
				return Status{Works: v.Works, Reason: v.Reason, Detail: v.Detail}
			}
			return Status{Reason: ReasonKVMChildFailed, Detail: fmt.Sprintf(
				"probe child gave no verdict (last stage %q, exit: %v, stderr: %q); does main call accel.MaybeRunChild first?",
				stage, err, firstLine(strings.TrimSpace(stderr.String())))}
		case <-ctx.Done():
			reap()
			return Status{Reason: ReasonKVMChildFailed, Detail: "probe canceled: " + ctx.Err().Error()}
		case <-timer.C:
			break wait
		}
	}
	exitedAfterKill := reap()
	// A verdict may have raced the timer.
	v, stage := parseChild(stdout.String())
	if v != nil {
		return Status{Works: v.Works, Reason: v.Reason, Detail: v.Detail}
	}
	detail := fmt.Sprintf("no verdict within %s (last stage %q); probe child killed", p.cfg.Timeout, stage)
	if !exitedAfterKill {
		detail += " but had not exited 500ms later"
	}
	return Status{Reason: ReasonKVMGuestHung, Detail: detail}
}

// parseChild reads the child's output: the verdict, if it gave one, and the
// last stage it reported ("" for none).
func parseChild(out string) (verdict *childLine, stage string) {
	for line := range strings.Lines(out) {
		var l childLine
		if json.Unmarshal([]byte(strings.TrimSpace(line)), &l) != nil {
			continue
		}
		if l.Stage != "" {
			stage = l.Stage
		}
		if l.Done && l.Reason != "" {
			verdict = &l
		}
	}
	if verdict != nil && verdict.Works != (verdict.Reason == ReasonOK) {
		verdict = &childLine{Done: true, Reason: ReasonKVMChildFailed, Detail: "incoherent verdict: " + verdict.Reason + ": " + verdict.Detail}
	}
	return verdict, stage
}
