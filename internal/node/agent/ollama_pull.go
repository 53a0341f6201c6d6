package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/wire/api"
)

// ollamaPullTimeout bounds one model pull (a large model on a slow link).
const ollamaPullTimeout = 6 * time.Hour

// ollamaProgressEvery is the most often a pull's progress is reported.
const ollamaProgressEvery = 2 * time.Second

// ollamaPulls pulls an Ollama preset's model once its server is Ready:
// POST /api/pull {"name": model, "stream": true} on the container's
// forwarded port, each progress line reported as the instance's status
// message (phase Ready), then "model … pulled" or the failure. One pull
// per instance start; a report of another phase cancels it.
type ollamaPulls struct {
	ctx    context.Context
	report func(ctx context.Context, id string, rep api.InstanceStatusReport) error
	client *http.Client
	log    *slog.Logger
	every  time.Duration

	mu   sync.Mutex
	runs map[string]*ollamaPull // by instance id
	wg   sync.WaitGroup
}

// ollamaPull is one instance's pull: key says for which start.
type ollamaPull struct {
	key    string
	cancel context.CancelFunc
}

func newOllamaPulls(ctx context.Context, report func(context.Context, string, api.InstanceStatusReport) error, log *slog.Logger) *ollamaPulls {
	return &ollamaPulls{ctx: ctx, report: report, client: &http.Client{}, log: log, every: ollamaProgressEvery,
		runs: map[string]*ollamaPull{}}
}

// observe sees a status report the reconciler made for instance id whose
// spec is spec: Ready for an Ollama preset starts its pull, once per start.
func (p *ollamaPulls) observe(id string, spec api.InstanceSpec, rep api.InstanceStatusReport) {
	pr := spec.Preset
	if pr == nil || pr.Name != api.PresetOllama || pr.Model == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.runs[id]
	if rep.Phase != api.InstanceReady {
		if cur != nil {
			cur.cancel()
			delete(p.runs, id)
		}
		return
	}
	key := strconv.FormatInt(rep.Generation, 10)
	if rep.Runtime != nil && rep.Runtime.StartedAt != nil {
		key += "@" + rep.Runtime.StartedAt.String()
	}
	if cur != nil && cur.key == key {
		return
	}
	if cur != nil {
		cur.cancel()
	}
	port := pr.Port
	if rep.Runtime != nil && rep.Runtime.Ports["api"] != 0 {
		port = rep.Runtime.Ports["api"]
	}
	ctx, cancel := context.WithTimeout(p.ctx, ollamaPullTimeout)
	p.runs[id] = &ollamaPull{key: key, cancel: cancel}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer cancel()
		p.run(ctx, id, pr.Model, "http://127.0.0.1:"+strconv.Itoa(port), rep)
	}()
}

// wait waits for the running pulls (tests).
func (p *ollamaPulls) wait() { p.wg.Wait() }

// ollamaLine is one line of /api/pull's stream.
type ollamaLine struct {
	Status    string `json:"status"`
	Digest    string `json:"digest"`
	Total     int64  `json:"total"`
	Completed int64  `json:"completed"`
	Error     string `json:"error"`
}

// run pulls model from the server at base and reports as it goes.
func (p *ollamaPulls) run(ctx context.Context, id, model, base string, rep api.InstanceStatusReport) {
	say := func(msg string) {
		r := rep
		r.Message, r.At = msg, time.Now().UTC()
		if err := p.report(context.WithoutCancel(ctx), id, r); err != nil {
			p.log.Warn("ollama pull progress not reported", "instance_id", id, "err", err)
		}
	}
	say("ollama pull " + model + ": starting")
	err := p.pull(ctx, model, base, say)
	switch {
	case ctx.Err() != nil && p.ctx.Err() == nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return // the instance left Ready: its next report says why
	case err != nil:
		p.log.Warn("ollama model pull failed", "instance_id", id, "model", model, "err", err)
		say(fmt.Sprintf("ollama pull %s failed: %v (the server runs without the model; pull it with POST /api/pull or restart the instance)", model, err))
	default:
		p.log.Info("ollama model pulled", "instance_id", id, "model", model)
		say("ollama model " + model + " pulled")
	}
}

// pull streams /api/pull, calling say with progress at most every p.every
// and at each new status.
func (p *ollamaPulls) pull(ctx context.Context, model, base string, say func(string)) error {
	body, _ := json.Marshal(map[string]any{"name": model, "stream": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/pull", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("pull request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("ollama server not reachable: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var l ollamaLine
		if json.Unmarshal(b, &l) == nil && l.Error != "" {
			return fmt.Errorf("%s: %s", resp.Status, l.Error)
		}
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	lastStatus, lastAt, success := "", time.Time{}, false
	for sc.Scan() {
		var l ollamaLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("unexpected pull stream line %q: %w", sc.Text(), err)
		}
		if l.Error != "" {
			return errors.New(l.Error)
		}
		if l.Status == "success" {
			success = true
			continue
		}
		msg := "ollama pull " + model + ": " + l.Status
		if l.Total > 0 {
			msg += fmt.Sprintf(": %d%% (%d/%d MB)", l.Completed*100/l.Total, l.Completed>>20, l.Total>>20)
		}
		if l.Status != lastStatus || time.Since(lastAt) >= p.every {
			say(msg)
			lastStatus, lastAt = l.Status, time.Now()
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("pull stream: %w", err)
	}
	if !success {
		return errors.New("the pull stream ended without success")
	}
	return nil
}

// postStatus posts one status report of instance id.
func (a *Agent) postStatus(ctx context.Context, id string, rep api.InstanceStatusReport) error {
	_, err := a.node.InstanceStatus(ctx, a.node.node(), id, rep)
	return err
}

// afterStatus hands a reported status to the Ollama pulls, with the
// instance's desired spec.
func (a *Agent) afterStatus(id string, rep api.InstanceStatusReport) {
	a.mu.Lock()
	v := a.vms
	a.mu.Unlock()
	if v == nil || v.pulls == nil {
		return
	}
	if d, ok := v.rec.Desired(id); ok {
		v.pulls.observe(id, d.Spec, rep)
	}
}
