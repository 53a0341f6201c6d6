package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/drover-dev/drover/internal/node/runtime"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/task"
)

// Error codes of image.pull besides the runtime's reasons.
const (
	// CodeContainerRuntimeUnavailable: this node runs no container
	// runtime (none configured, or its engine was not reachable at start).
	CodeContainerRuntimeUnavailable = "container_runtime_unavailable"
)

// ImagePullHandler runs image.pull: it pulls params.ref through the node's
// container runtime (rt gives the agent's runtime, nil when it runs none;
// runtime.PullerOf finds the container side of a Router) and reports the
// pull as phases: "resolve" (until the registry's first layer line),
// "layer <short id> download" (first line of the layer to "Download
// complete", or to its first "Extracting" when the engine skipped that
// line), "layer <short id> extract" (first "Extracting" to "Pull
// complete"), "layer <short id> cached" for a layer the engine already
// has, "layer <short id>" for one whose lines fit neither (from its first
// line to its last), and "verify" (the pulled image inspected, its digest
// checked against params.digest). The registry_auth secret is read with
// secret (NODE_AGENT_SECRETS_DIR: the control plane serves secrets per
// instance only). Failures: invalid_params, container_runtime_unavailable,
// secrets_missing, secrets_injection_failed, image_pull_failed (the
// registry's message; on a digest mismatch both digests).
func ImagePullHandler(rt func() runtime.Runtime, secret func(name string) ([]byte, error), now func() time.Time) Handler {
	return Handler{Timeout: task.ImagePullTimeout, Run: func(ctx context.Context, t Task) (Outcome, error) {
		p, fe := task.DecodeImagePullParams(t.Params)
		if fe != nil {
			return Outcome{}, &HandlerError{api.CodedError{Code: "invalid_params", Message: fieldErrorText(fe)}}
		}
		var puller runtime.ImagePuller
		var engine string
		if r := rt(); r != nil {
			puller, _ = runtime.PullerOf(r)
			if er, ok := puller.(runtime.EngineReporter); ok {
				name, version := er.ContainerEngine()
				engine = name + " " + version
			}
		}
		if puller == nil {
			return Outcome{}, &HandlerError{api.CodedError{Code: CodeContainerRuntimeUnavailable,
				Message: "this node runs no container runtime (NODE_AGENT_CONTAINER_RUNTIME is unset, or its engine was not reachable when the agent started): image.pull needs one"}}
		}
		var auth []byte
		if p.RegistryAuth != "" {
			b, err := secret(p.RegistryAuth)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				return Outcome{}, &HandlerError{api.CodedError{Code: string(api.ReasonSecretsMissing),
					Message: fmt.Sprintf("registry auth secret %q is not on this node (NODE_AGENT_SECRETS_DIR)", p.RegistryAuth), Err: err}}
			case err != nil:
				return Outcome{}, &HandlerError{api.CodedError{Code: string(api.ReasonSecretsInjectionFailed),
					Message: fmt.Sprintf("registry auth secret %q: %v", p.RegistryAuth, err), Err: err}}
			}
			auth = b
		}
		ref := p.Ref
		if p.Digest != "" && !task.ImageRefHasTag(ref) {
			ref += "@" + p.Digest // no tag: pull what the digest names
		}
		pctx, cancel := context.WithTimeout(ctx, time.Duration(p.TimeoutSeconds)*time.Second)
		defer cancel()
		ph := newPullPhases(now, t.Progress)
		id, err := puller.Pull(pctx, ref, p.Digest, auth, ph.observe)
		out := task.ImagePullOutput{Ref: p.Ref, Digest: p.Digest, ImageID: id, Engine: engine}
		out.Layers, err = ph.finish(err)
		o := Outcome{Output: out, Timings: ph.timings}
		if err != nil {
			msg := err.Error()
			var re *runtime.Error
			if errors.As(err, &re) {
				msg = re.Err.Error()
			}
			if pctx.Err() != nil && ctx.Err() == nil {
				msg = fmt.Sprintf("the pull did not finish in %ds (params.timeout_seconds): %s", p.TimeoutSeconds, msg)
			}
			return o, &HandlerError{api.CodedError{Code: string(api.ReasonImagePullFailed), Message: msg, Err: err}}
		}
		return o, nil
	}}
}

// imagePullRuntime is the agent's runtime for image.pull (nil when it runs no
// instances).
func (a *Agent) imagePullRuntime() runtime.Runtime {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.vms == nil {
		return nil
	}
	return a.vms.rt
}

// pullPhases turns the engine's progress lines into task phases: one
// download and one extract phase per layer, each from its first line to
// its last.
type pullPhases struct {
	now      func() time.Time
	report   func(phase string, d time.Duration, err error)
	start    time.Time
	last     time.Time // the last progress line
	resolved time.Time // zero until the first layer line
	layers   map[string]*pullLayer
	order    []string
	timings  map[string]int64
}

type pullLayer struct {
	first, dlDone, exStart time.Time
	done                   bool // its last phase is reported
	out                    task.ImagePullLayer
}

func newPullPhases(now func() time.Time, report func(string, time.Duration, error)) *pullPhases {
	if report == nil {
		report = func(string, time.Duration, error) {}
	}
	t := now()
	return &pullPhases{now: now, report: report, start: t, last: t, layers: map[string]*pullLayer{},
		timings: map[string]int64{}}
}

func (p *pullPhases) observe(layer, status string) {
	t := p.now()
	p.last = t
	if layer == "" {
		return
	}
	if p.resolved.IsZero() {
		p.resolved = t
		p.phase("resolve", t.Sub(p.start), nil)
	}
	l := p.layers[layer]
	if l == nil {
		l = &pullLayer{first: t, out: task.ImagePullLayer{ID: layer}}
		p.layers[layer] = l
		p.order = append(p.order, layer)
	}
	l.out.Status = status
	if l.done {
		return
	}
	switch status {
	case "Already exists":
		l.done = true
		p.phase("layer "+layer+" cached", t.Sub(l.first), nil)
	case "Download complete":
		p.downloaded(layer, l, t)
	case "Extracting":
		// The engine passes on only a layer's latest progress to a slow
		// reader, so "Download complete" may never come: the download
		// was over by the first line of the extraction.
		p.downloaded(layer, l, t)
		if l.exStart.IsZero() {
			l.exStart = t
		}
	case "Pull complete":
		from := l.exStart
		if from.IsZero() {
			from = l.dlDone
		}
		if from.IsZero() {
			from = l.first
		}
		l.done = true
		l.out.ExtractMS = t.Sub(from).Milliseconds()
		p.phase("layer "+layer+" extract", t.Sub(from), nil)
	}
}

// downloaded ends layer l's download phase at t, once.
func (p *pullPhases) downloaded(layer string, l *pullLayer, t time.Time) {
	if l.dlDone.IsZero() {
		l.dlDone = t
		l.out.DownloadMS = t.Sub(l.first).Milliseconds()
		p.phase("layer "+layer+" download", t.Sub(l.first), nil)
	}
}

// finish reports what is left once Pull returned err: the unfinished
// layers (a failed pull fails the first one's current phase), resolve
// when no layer line came (an image the engine has), and verify (the
// time after the last line; failed on a digest mismatch).
func (p *pullPhases) finish(err error) ([]task.ImagePullLayer, error) {
	end := p.now()
	mismatch := errors.Is(err, runtime.ErrDigestMismatch)
	attributed := err == nil || mismatch // the failure is reported once
	if p.resolved.IsZero() {
		p.resolved = p.last
		var rerr error
		if !attributed {
			rerr, attributed = err, true
		}
		p.phase("resolve", p.last.Sub(p.start), rerr)
	}
	layers := make([]task.ImagePullLayer, 0, len(p.order))
	for _, id := range p.order {
		l := p.layers[id]
		if !l.done {
			var lerr error
			if !attributed {
				lerr, attributed = err, true
			}
			switch {
			case lerr != nil && l.dlDone.IsZero():
				p.phase("layer "+id+" download", p.last.Sub(l.first), lerr)
			case lerr != nil:
				p.phase("layer "+id+" extract", p.last.Sub(l.dlDone), lerr)
			default:
				p.phase("layer "+id, p.last.Sub(l.first), nil)
			}
		}
		layers = append(layers, l.out)
	}
	if len(p.order) > 0 {
		p.timings["layers_ms"] = p.last.Sub(p.resolved).Milliseconds()
	}
	switch {
	case err == nil || mismatch:
		p.phase("verify", end.Sub(p.last), err)
	case !attributed: // every layer was done: the inspect failed
		p.phase("verify", end.Sub(p.last), err)
	}
	return layers, err
}

func (p *pullPhases) phase(name string, d time.Duration, err error) {
	switch name {
	case "resolve", "verify":
		p.timings[name+"_ms"] = d.Milliseconds()
	}
	p.report(name, d, err)
}
