package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/drover-dev/drover/internal/node/agent/statedir"
	"github.com/drover-dev/drover/internal/node/probe"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
	"github.com/drover-dev/drover/internal/wire/signal"
	"github.com/drover-dev/drover/internal/wire/task"
)

const (
	pollWait = 30 * time.Second
	// recordKeep is how long executed task ids stay in the replay cache
	// after their envelope expired (an expired envelope is refused anyway).
	recordKeep = 24 * time.Hour
	// jwksRefreshInterval is the least time between two JWKS refreshes that
	// an unknown kid triggers.
	jwksRefreshInterval = time.Minute
)

// errJWKSRefreshThrottled marks an unknown kid seen within
// jwksRefreshInterval of the last JWKS refresh. Such a delivery is neither
// run nor answered: its lease runs out and the control plane delivers it
// again, when a refresh is allowed.
var errJWKSRefreshThrottled = errors.New("task-signing key refresh throttled")

// taskLoop long-polls for tasks and runs each in its own goroutine, at most
// NODE_AGENT_TASK_SLOTS at once. Each long-poll asks for as many tasks as
// there are free slots (GET .../tasks/wait?max=N, at most api.MaxClaim), so
// a burst of queued tasks comes in one answer instead of one round trip
// each. It returns only after
// every task it started has finished, so that nothing touches the state
// directory once Run returned.
func (a *Agent) taskLoop(ctx context.Context) error {
	sem := make(chan struct{}, a.cfg.taskSlots())
	var inflight sync.WaitGroup
	defer inflight.Wait()
	bo := newBackoff(500*time.Millisecond, 30*time.Second)
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := 1 + takeFree(sem, api.MaxClaim-1)
		ds, err := a.waitTasks(ctx, free)
		for range free - len(ds) {
			<-sem
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// A 429 is reported and waited out (Retry-After, backoff):
			// never retried harder.
			reason := a.noteFailure(opTaskPoll, err)
			a.metrics.pollFailures.WithLabelValues(reason).Inc()
			a.log.Warn("task poll failed", "err", err, "signal", reason)
			if err := bo.wait(ctx, retryAfter(err)); err != nil {
				return nil
			}
			continue
		}
		bo.reset()
		for _, d := range ds {
			inflight.Go(func() {
				defer func() { <-sem }()
				a.handleDelivery(ctx, d)
			})
		}
	}
}

// takeFree takes the slots of sem that are free now, at most max, without
// waiting, and says how many.
func takeFree(sem chan struct{}, max int) int {
	n := 0
	for n < max {
		select {
		case sem <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

// waitTasks long-polls for up to max tasks. A server that answers with
// more than max (it never should) gets only max of them run; the rest are
// left to their lease, as a lost delivery is.
func (a *Agent) waitTasks(ctx context.Context, max int) ([]api.TaskDelivery, error) {
	ctx, cancel := context.WithTimeout(ctx, pollWait+15*time.Second)
	defer cancel()
	ds, err := a.node.WaitTasks(ctx, a.node.node(), pollWait, max)
	if len(ds) > max {
		a.log.Warn("control plane delivered more tasks than asked for", "asked", max, "delivered", len(ds))
		ds = ds[:max]
	}
	return ds, err
}

// verify checks the envelope (refreshing the JWKS on an unknown kid, at
// most once per jwksRefreshInterval) and that the outer delivery matches
// the signed claims.
func (a *Agent) verify(ctx context.Context, d api.TaskDelivery) (api.TaskClaims, error) {
	claims, err := a.verifier.Verify(d.Envelope, a.nodeID, a.now())
	if errors.Is(err, task.ErrUnknownKey) {
		claims, err = a.verifyAfterRefresh(ctx, d)
	}
	if err != nil {
		return claims, err
	}
	return claims, task.CheckDelivery(d, claims)
}

// verifyAfterRefresh handles an unknown kid: it refreshes the JWKS and
// verifies again, unless a refresh (successful or not) happened within
// jwksRefreshInterval. Then it fails with errJWKSRefreshThrottled without
// asking the control plane: a flood of deliveries with made-up kids costs
// one JWKS request a minute. Refreshes are serialised, so deliveries that
// arrive together after a key rotation share one request.
func (a *Agent) verifyAfterRefresh(ctx context.Context, d api.TaskDelivery) (api.TaskClaims, error) {
	a.jwksMu.Lock()
	defer a.jwksMu.Unlock()
	// Another delivery may have refreshed the keys while this one waited.
	claims, err := a.verifier.Verify(d.Envelope, a.nodeID, a.now())
	if !errors.Is(err, task.ErrUnknownKey) {
		return claims, err
	}
	now := a.now()
	if last := a.jwksRefreshedAt; !last.IsZero() && now.Sub(last) < jwksRefreshInterval {
		a.metrics.jwksRefreshes.WithLabelValues("throttled").Inc()
		return claims, fmt.Errorf("%w: %w (keys refreshed %s ago; the next refresh is allowed in %s)",
			errJWKSRefreshThrottled, err, now.Sub(last).Round(time.Second),
			(jwksRefreshInterval - now.Sub(last)).Round(time.Second))
	}
	a.jwksRefreshedAt = now
	if rerr := a.refreshJWKS(ctx); rerr != nil {
		a.metrics.jwksRefreshes.WithLabelValues("failed").Inc()
		a.log.Warn("refresh task-signing keys", "err", rerr)
		return claims, err
	}
	a.metrics.jwksRefreshes.WithLabelValues("ok").Inc()
	return a.verifier.Verify(d.Envelope, a.nodeID, a.now())
}

// refreshJWKS fetches and installs the control plane's JWKS; jwksMu is
// held.
func (a *Agent) refreshJWKS(ctx context.Context) error {
	jwks, err := a.node.JWKS(ctx, a.node.node())
	if err != nil {
		return err
	}
	a.jwksGen++
	if err := a.verifier.SetKeys(jwks); err != nil {
		return err
	}
	a.mu.Lock()
	a.ident.JWKS = jwks
	id := a.ident
	a.mu.Unlock()
	return a.state.SaveIdentity(id)
}

// handleDelivery verifies, dedupes, runs and reports one task.
func (a *Agent) handleDelivery(ctx context.Context, d api.TaskDelivery) {
	log := a.log.With("task_id", d.TaskID, "task_type", d.TaskType, "correlation_id", d.CorrelationID)
	a.metrics.tasksReceived.Inc()
	claims, err := a.verify(ctx, d)
	if errors.Is(err, errJWKSRefreshThrottled) {
		// Not recorded as seen and no result: the redelivery after the
		// lease ends is verified afresh.
		a.metrics.tasksRejected.WithLabelValues("jwks_refresh_throttled").Inc()
		log.Warn("task envelope signed with an unknown key; left for redelivery", "err", err, "attempt", d.Attempt)
		return
	}
	if err != nil {
		code := task.Code(err)
		a.metrics.tasksRejected.WithLabelValues(code).Inc()
		log.Error("task envelope rejected; not executing", "code", code, "err", err)
		// The agent claims tasks it cannot run: signing keys, clocks or
		// versions disagree (node_task_claim_failed) until one verifies.
		a.diag.report(signal.TaskClaimFailed, opVerify, fmt.Sprintf("task %s (%s) refused: %s", d.TaskID, d.TaskType, code), d.CorrelationID)
		if _, berr := a.state.Begin(d.TaskID, d.CorrelationID, a.now().Add(time.Hour), a.now()); berr != nil {
			log.Error("cannot record rejected task", "err", berr)
			return
		}
		a.finish(ctx, d.TaskID, api.TaskResult{Status: api.ResultFailed, CorrelationID: d.CorrelationID,
			Error: &api.ResultError{Code: code, Message: err.Error()}})
		return
	}
	a.diag.clear(signal.TaskClaimFailed)
	rec, err := a.state.Begin(claims.TaskID, claims.CorrelationID, time.Unix(claims.ExpiresAt, 0), a.now())
	if errors.Is(err, statedir.ErrSeen) {
		a.metrics.tasksDuplicate.Inc()
		if rec.Result != nil {
			log.Info("task already executed; re-posting its result", "attempt", d.Attempt)
			a.finish(ctx, claims.TaskID, *rec.Result)
			return
		}
		log.Warn("task started before an agent restart and never finished; not running it again")
		a.finish(ctx, claims.TaskID, interruptedResult(claims.CorrelationID))
		return
	} else if err != nil {
		log.Error("replay cache unavailable; not executing", "err", err)
		a.noteWrite("replay cache", err)
		return
	}
	a.finish(ctx, claims.TaskID, a.run(ctx, claims, log))
}

// run executes a verified task with its handler, bounded by its timeout.
func (a *Agent) run(ctx context.Context, c api.TaskClaims, log interface {
	Info(string, ...any)
	Error(string, ...any)
}) api.TaskResult {
	res := api.TaskResult{CorrelationID: c.CorrelationID}
	h, ok := a.handlers[c.Type]
	if !ok {
		res.Status, res.Error = api.ResultFailed, &api.ResultError{Code: "unknown_task_type",
			Message: fmt.Sprintf("this agent has no handler for %q", c.Type)}
		return res
	}
	a.postEvent(ctx, c, api.TaskEvent{Phase: "started", Status: "started"})
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := a.now()
	log.Info("running task")
	out, err := h.Run(hctx, Task{ID: c.TaskID, Type: c.Type, CorrelationID: c.CorrelationID, Params: c.Params,
		Progress: func(phase string, d time.Duration, perr error) {
			ev := api.TaskEvent{Phase: phase, Status: "succeeded", DurationMS: d.Milliseconds()}
			if perr != nil {
				ev.Status, ev.Message = "failed", perr.Error()
			}
			a.postEvent(ctx, c, ev)
		}})
	res.Timings = out.Timings
	if res.Timings == nil {
		res.Timings = map[string]int64{}
	}
	res.Timings["total_ms"] = a.now().Sub(start).Milliseconds()
	if out.Output != nil {
		b, merr := json.Marshal(out.Output)
		if merr != nil {
			err = errors.Join(err, fmt.Errorf("encode output: %w", merr))
		}
		res.Output = b
	}
	switch {
	case err == nil:
		res.Status = api.ResultSucceeded
	default:
		res.Status = api.ResultFailed
		var he *HandlerError
		switch {
		case errors.As(err, &he):
			res.Error = &api.ResultError{Code: he.Code, Message: he.Message, Fields: he.Fields}
		case ctx.Err() != nil:
			res.Error = &api.ResultError{Code: "agent_shutdown", Message: "the agent stopped while this task ran: " + err.Error()}
		case errors.Is(hctx.Err(), context.DeadlineExceeded):
			res.Error = &api.ResultError{Code: "handler_timeout", Message: fmt.Sprintf("handler exceeded %s: %v", timeout, err)}
		default:
			res.Error = &api.ResultError{Code: "handler_failed", Message: err.Error()}
		}
		log.Error("task failed", "code", res.Error.Code, "err", err)
	}
	return res
}

// postEvent reports progress; failures are logged, never fatal.
func (a *Agent) postEvent(ctx context.Context, c api.TaskClaims, ev api.TaskEvent) {
	ev.At = a.now().UTC()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.node.PostEvent(ctx, a.node.node(), c.TaskID, c.CorrelationID, ev); err != nil {
		a.log.Warn("post task event", "task_id", c.TaskID, "phase", ev.Phase, "err", err, "correlation_id", c.CorrelationID)
	}
}

// finish makes the result durable, then tries to post it once; the result
// loop retries what could not be posted.
func (a *Agent) finish(ctx context.Context, taskID string, res api.TaskResult) {
	if res.FinishedAt.IsZero() {
		res.FinishedAt = a.now().UTC()
	}
	err := a.state.SaveResult(taskID, res)
	if err != nil {
		a.log.Error("spool task result", "task_id", taskID, "err", err, "correlation_id", res.CorrelationID)
	}
	a.noteWrite("spool task result", err)
	if err := a.postResult(ctx, taskID, res); err != nil {
		a.log.Warn("post task result; will retry", "task_id", taskID, "err", err, "correlation_id", res.CorrelationID)
		select {
		case a.wakeSpool <- struct{}{}:
		default:
		}
	}
}

// postResult posts a result and marks it posted. A 404 or 409 is final: the
// control plane will never accept it, so it is logged and dropped from the
// spool. A 422 to a result whose error carries fields is a control plane
// that predates api.ResultError.Fields (it decodes strictly): the result is
// posted again without them (its message names them too).
//
// Posts are serialised (postMu): the result loop reads the spool while
// finish posts a result it has just spooled, and retrySpooled skips what
// was posted meanwhile. finish always posts: it also answers a redelivery
// of an executed task, whose result the control plane lost.
//
// Results that end while a post is in flight wait in postQueue; whoever
// holds postMu next posts every waiting result, several in one POST
// .../tasks/results, as a group commit takes every waiting write. Each
// caller still gets its own result's outcome.
func (a *Agent) postResult(ctx context.Context, taskID string, res api.TaskResult) error {
	p := &queuedResult{taskID: taskID, res: res, done: make(chan error, 1)}
	a.postQueue.Lock()
	a.postQueue.items = append(a.postQueue.items, p)
	a.postQueue.Unlock()
	a.postMu.Lock()
	a.postQueue.Lock()
	batch := a.postQueue.items
	a.postQueue.items = nil
	a.postQueue.Unlock()
	if len(batch) > 0 { // else an earlier holder posted ours
		a.postResultsLocked(ctx, batch)
	}
	a.postMu.Unlock()
	return <-p.done
}

// queuedResult is a result waiting for postMu (postResult).
type queuedResult struct {
	taskID string
	res    api.TaskResult
	done   chan error // the outcome, buffered
}

// postResultsLocked posts batch: one result on its own route, several in
// one POST .../tasks/results. A control plane without that route (a 404 or
// 405 without an error envelope: it predates it) gets them one by one, now
// and from then on; a batch refused as a whole otherwise (another 4xx but
// 429: larger than the control plane reads, say) is posted one by one this
// time.
func (a *Agent) postResultsLocked(ctx context.Context, batch []*queuedResult) {
	if len(batch) == 1 || a.noResultsRoute.Load() {
		for _, p := range batch {
			p.done <- a.postResultLocked(ctx, p.taskID, p.res)
		}
		return
	}
	items := make([]api.TaskResultFor, len(batch))
	for i, p := range batch {
		items[i] = api.TaskResultFor{TaskID: p.taskID, Result: p.res}
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	ack, err := a.node.PostResults(pctx, a.node.node(), items)
	cancel()
	var he *nodeapi.Error
	if errors.As(err, &he) && he.Status >= 400 && he.Status < 500 && he.Status != http.StatusTooManyRequests {
		if (he.Status == http.StatusNotFound || he.Status == http.StatusMethodNotAllowed) && he.Code == "" {
			// The mux's own answer, not a handler's error envelope.
			a.log.Info("control plane has no POST .../tasks/results; posting results one by one", "err", err)
			a.noResultsRoute.Store(true)
		} else {
			a.log.Warn("control plane refused a batch of results; posting them one by one", "results", len(batch), "err", err)
		}
		for _, p := range batch {
			p.done <- a.postResultLocked(ctx, p.taskID, p.res)
		}
		return
	}
	for i, p := range batch {
		perr := err
		switch {
		case err != nil:
		case i >= len(ack.Results) || ack.Results[i].TaskID != p.taskID:
			perr = fmt.Errorf("control plane did not answer result %d (task %s) of %d", i, p.taskID, len(batch))
		default:
			perr = ack.Results[i].Err()
		}
		if IsStatus(perr, http.StatusUnprocessableEntity) && p.res.Error != nil && len(p.res.Error.Fields) > 0 {
			p.done <- a.postResultLocked(ctx, p.taskID, p.res) // the single route's fallback without fields
			continue
		}
		p.done <- a.settleResult(p.taskID, p.res, perr)
	}
}

// retrySpooled posts a spooled result unless it was posted since the spool
// was read.
func (a *Agent) retrySpooled(ctx context.Context, taskID string, res api.TaskResult) error {
	a.postMu.Lock()
	defer a.postMu.Unlock()
	if done, err := a.state.Posted(taskID); err == nil && done {
		return nil
	}
	return a.postResultLocked(ctx, taskID, res)
}

// postResultLocked posts one result on POST .../tasks/{id}/result and
// settles it.
func (a *Agent) postResultLocked(ctx context.Context, taskID string, res api.TaskResult) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err := a.node.PostResult(ctx, a.node.node(), taskID, res.CorrelationID, res)
	if err != nil && IsStatus(err, http.StatusUnprocessableEntity) && res.Error != nil && len(res.Error.Fields) > 0 {
		a.log.Warn("control plane refused a task result with error fields; posting it without them",
			"task_id", taskID, "err", err, "correlation_id", res.CorrelationID)
		plain := *res.Error
		plain.Fields = nil
		res.Error = &plain
		_, err = a.node.PostResult(ctx, a.node.node(), taskID, res.CorrelationID, res)
	}
	return a.settleResult(taskID, res, err)
}

// settleResult acts on the outcome err of posting a result: a failure the
// control plane may get over leaves it spooled (returned, reported as
// task_result_post_failed); a success, or a 404 or 409 (final), marks it
// posted.
func (a *Agent) settleResult(taskID string, res api.TaskResult, err error) error {
	if err != nil && !IsStatus(err, http.StatusNotFound) && !IsStatus(err, http.StatusConflict) {
		a.metrics.resultFailures.Inc()
		seen := "error: " + err.Error()
		if f, ok := probe.Classify(err, a.cpTarget()); ok {
			seen = string(f.Signal) + " (" + f.Detail + ")"
		}
		// The result stays spooled; the result loop posts it again.
		a.diag.report(signal.TaskResultPostFailed, opResult, fmt.Sprintf("posting the result of task %s failed: %s; %d results spooled",
			taskID, seen, max(a.countSpooled(), 1)), res.CorrelationID)
		return err
	}
	if err != nil {
		a.log.Error("control plane refused task result for good", "task_id", taskID, "err", err,
			"correlation_id", res.CorrelationID)
	} else {
		a.metrics.resultsPosted.Inc()
	}
	if err := a.state.MarkPosted(taskID); err != nil {
		return err
	}
	if a.countSpooled() == 0 {
		a.diag.clear(signal.TaskResultPostFailed)
	}
	return nil
}

// interruptedResult is the result of a task whose handler an agent
// restart cut off: it is never run again.
func interruptedResult(correlationID string) api.TaskResult {
	return api.TaskResult{Status: api.ResultFailed, CorrelationID: correlationID,
		Error: &api.ResultError{Code: "agent_restarted_during_task",
			Message: "the agent restarted while this task ran; it is not re-executed"}}
}

// spoolInterrupted runs once as the agent starts, before it takes tasks:
// every task the replay cache shows begun without a result (the handler a
// crash or kill -9 cut off) gets interruptedResult in the spool, which the
// result loop posts. The control plane learns of it at once instead of
// when the task's lease ends (its handler timeout plus 30 s: over 20
// minutes for slice.vm_provision), so the work waiting on it (a slice workflow's
// compensation) goes on; a redelivery of the task re-posts the same
// result.
func (a *Agent) spoolInterrupted() {
	recs, err := a.state.Interrupted()
	if err != nil {
		a.log.Error("read the replay cache for interrupted tasks", "err", err)
	}
	for _, rec := range recs {
		res := interruptedResult(rec.CorrelationID)
		res.FinishedAt = a.now().UTC()
		if err := a.state.SaveResult(rec.TaskID, res); err != nil {
			a.log.Error("spool the result of an interrupted task", "task_id", rec.TaskID, "err", err)
			a.noteWrite("result spool", err)
			continue
		}
		a.log.Warn("task was running when the agent stopped; reporting it failed (agent_restarted_during_task)",
			"task_id", rec.TaskID, "correlation_id", rec.CorrelationID, "started_at", rec.StartedAt)
	}
}

// resultLoop retries spooled results with backoff and prunes the cache.
func (a *Agent) resultLoop(ctx context.Context) error {
	bo := newBackoff(time.Second, time.Minute)
	for {
		pending, err := a.state.Pending()
		if err != nil {
			a.log.Error("read result spool", "err", err)
		}
		a.metrics.spoolPending.Set(float64(len(pending)))
		a.spooled.Store(int64(len(pending)))
		failed := false
		for _, rec := range pending {
			if err := a.retrySpooled(ctx, rec.TaskID, *rec.Result); err != nil {
				failed = true
				a.log.Warn("retry task result", "task_id", rec.TaskID, "err", err)
				break
			}
		}
		if _, err := a.state.Prune(a.now(), recordKeep); err != nil {
			a.log.Warn("prune replay cache", "err", err)
		}
		wait := 30 * time.Second
		if failed {
			wait = bo.next()
		} else {
			bo.reset()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-a.wakeSpool:
			t.Stop()
		case <-t.C:
		}
	}
}
