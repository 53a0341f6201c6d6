package tasks

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/drover-dev/drover/internal/cp/httpapi"
	"github.com/drover-dev/drover/internal/wire/api"
	"github.com/drover-dev/drover/internal/wire/nodeapi"
)

// Results (nodeapi.PostResults) records the results of several of the
// node's tasks in one request. Each is checked, recorded and audited as
// Result does it, and answered on its own: a refused result (unknown task,
// another node's, a conflicting replay, an invalid one) does not stop the
// others. They are recorded concurrently, so the store commits them
// together (one group commit on SQLite, one batch on PostgreSQL); every
// answer comes after the commit that holds its result. A body that is not
// a list of 1 to api.MaxResultBatch results of distinct tasks is refused
// whole (422 naming the field).
func (s *Room) Results(w http.ResponseWriter, r *http.Request, nodeID string) error {
	var req api.TaskResults
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		return err
	}
	if fields := checkResults(req); len(fields) > 0 {
		return httpapi.Invalid(fields)
	}
	acks := make([]nodeapi.ResultItemAck, len(req.Results))
	var wg sync.WaitGroup
	for i, item := range req.Results {
		wg.Go(func() {
			acks[i] = s.resultAck(r, nodeID, item)
		})
	}
	wg.Wait()
	httpapi.WriteJSON(w, http.StatusOK, nodeapi.ResultsAck{Results: acks})
	return nil
}

// checkResults names what makes a TaskResults unacceptable as a whole.
func checkResults(req api.TaskResults) []api.FieldError {
	if len(req.Results) == 0 || len(req.Results) > api.MaxResultBatch {
		return []api.FieldError{{Field: "results", Message: fmt.Sprintf("must hold 1 to %d results", api.MaxResultBatch)}}
	}
	seen := make(map[string]bool, len(req.Results))
	for i, item := range req.Results {
		field := fmt.Sprintf("results[%d].task_id", i)
		switch {
		case item.TaskID == "":
			return []api.FieldError{{Field: field, Message: "required"}}
		case seen[item.TaskID]:
			return []api.FieldError{{Field: field, Message: fmt.Sprintf("task %q appears twice", item.TaskID)}}
		}
		seen[item.TaskID] = true
	}
	return nil
}

// resultAck records one result of a batch and answers it as Result would.
func (s *Room) resultAck(r *http.Request, nodeID string, item api.TaskResultFor) nodeapi.ResultItemAck {
	t, err := s.complete(r.Context(), nodeID, item.TaskID, item.Result)
	if err == nil {
		return nodeapi.ResultItemAck{TaskID: item.TaskID, Status: http.StatusOK, State: t.State}
	}
	he := httpapi.AsError(s.log, r, err)
	d := he.Detail(r.Context())
	return nodeapi.ResultItemAck{TaskID: item.TaskID, Status: he.Status, Error: &d}
}
