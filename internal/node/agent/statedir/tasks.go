package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/drover-dev/drover/internal/node/atomicfile"

	"github.com/drover-dev/drover/internal/wire/api"
)

// TaskRecord is one task the agent has accepted: the replay-cache entry and,
// once the handler finished, the spooled result. One file per task,
// tasks/<task_id>.json.
type TaskRecord struct {
	TaskID string `json:"task_id"`
	// CorrelationID is the task's, for the result posted after a restart
	// interrupted it (records older than the field have none).
	CorrelationID string          `json:"correlation_id,omitempty"`
	ExpiresAt     time.Time       `json:"expires_at"`
	StartedAt     time.Time       `json:"started_at"`
	Result        *api.TaskResult `json:"result,omitempty"`
	Posted        bool            `json:"posted"`
}

const recordExt = ".json"

func recordName(taskID string) string { return taskID + recordExt }

func checkTaskID(taskID string) error {
	if !ValidTaskID(taskID) {
		return fmt.Errorf("statedir: task id %q: %w", taskID, ErrInvalidID)
	}
	return nil
}

// load reads the record of taskID; the caller holds d.mu.
func (d *Dir) load(taskID string) (TaskRecord, bool, error) {
	b, ok, err := readFile(d.tasksPath(), recordName(taskID))
	if err != nil || !ok {
		return TaskRecord{}, false, err
	}
	var rec TaskRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return TaskRecord{}, true, fmt.Errorf("statedir: decode record of task %s: %w", taskID, err)
	}
	if rec.TaskID != taskID {
		// Only possible on a case-insensitive filesystem ("abc" vs "ABC").
		return rec, true, fmt.Errorf("statedir: task id %q collides with recorded %q: %w", taskID, rec.TaskID, ErrInvalidID)
	}
	return rec, true, nil
}

// store writes rec atomically; the caller holds d.mu.
func (d *Dir) store(rec TaskRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("statedir: encode record of task %s: %w", rec.TaskID, err)
	}
	return writeAtomic(d.tasksPath(), recordName(rec.TaskID), b)
}

// Begin durably records that taskID is about to execute. If a record exists
// already it returns that record and an error matching ErrSeen: the caller
// must not run the task again, but re-post its result when one is saved. A
// record that exists but cannot be read also counts as seen.
func (d *Dir) Begin(taskID, correlationID string, expiresAt time.Time, now time.Time) (TaskRecord, error) {
	if err := checkTaskID(taskID); err != nil {
		return TaskRecord{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, ok, err := d.load(taskID)
	switch {
	case ok && err != nil && !errors.Is(err, ErrInvalidID):
		return TaskRecord{TaskID: taskID}, fmt.Errorf("%w (%w)", ErrSeen, err)
	case err != nil:
		return TaskRecord{}, err
	case ok:
		return rec, fmt.Errorf("statedir: task %s: %w", taskID, ErrSeen)
	}
	rec = TaskRecord{TaskID: taskID, CorrelationID: correlationID, ExpiresAt: expiresAt.UTC(), StartedAt: now.UTC()}
	if err := d.store(rec); err != nil {
		return TaskRecord{}, err
	}
	return rec, nil
}

// SaveResult durably stores the result of a begun task and marks it not
// yet posted. It must return before the agent tries to post r.
func (d *Dir) SaveResult(taskID string, r api.TaskResult) error {
	return d.update(taskID, func(rec *TaskRecord) (bool, error) {
		rec.Result = &r
		rec.Posted = false
		return true, nil
	})
}

// MarkPosted records that the control plane accepted the task's result.
// Marking twice is not an error.
func (d *Dir) MarkPosted(taskID string) error {
	return d.update(taskID, func(rec *TaskRecord) (bool, error) {
		if rec.Result == nil {
			return false, fmt.Errorf("statedir: task %s has no saved result to mark posted", taskID)
		}
		if rec.Posted {
			return false, nil
		}
		rec.Posted = true
		return true, nil
	})
}

// Posted reports whether the result of taskID was marked posted; false for
// an unknown task.
func (d *Dir) Posted(taskID string) (bool, error) {
	if err := checkTaskID(taskID); err != nil {
		return false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, ok, err := d.load(taskID)
	return ok && rec.Posted, err
}

// update applies fn to the record of taskID and stores it when fn reports
// a change.
func (d *Dir) update(taskID string, fn func(*TaskRecord) (changed bool, err error)) error {
	if err := checkTaskID(taskID); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rec, ok, err := d.load(taskID)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("statedir: task %s: %w", taskID, ErrNotFound)
	}
	changed, err := fn(&rec)
	if err != nil || !changed {
		return err
	}
	return d.store(rec)
}

// all reads every record; the caller holds d.mu. Unreadable records are
// reported in err (joined) and left out of recs; temporary files and names
// that are not task records are ignored.
func (d *Dir) all() (recs []TaskRecord, err error) {
	ents, err := os.ReadDir(d.tasksPath())
	if err != nil {
		return nil, fmt.Errorf("statedir: list tasks: %w", err)
	}
	var errs []error
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), recordExt)
		if !ok || !e.Type().IsRegular() || !ValidTaskID(id) {
			continue
		}
		rec, ok, err := d.load(id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			recs = append(recs, rec)
		}
	}
	return recs, errors.Join(errs...)
}

// Pending returns the records whose result is saved but not yet posted,
// oldest (by StartedAt) first. Records that cannot be read are reported in
// the error, and the readable ones are still returned alongside it.
func (d *Dir) Pending() ([]TaskRecord, error) {
	return d.oldestFirst(func(r TaskRecord) bool { return r.Result != nil && !r.Posted })
}

// Interrupted returns the records begun without a result, oldest (by
// StartedAt) first: at an agent's start, the tasks whose handler a crash
// or kill cut off. Unreadable records are reported as Pending does.
func (d *Dir) Interrupted() ([]TaskRecord, error) {
	return d.oldestFirst(func(r TaskRecord) bool { return r.Result == nil })
}

// oldestFirst returns the readable records keep selects, sorted by
// StartedAt then TaskID, with the unreadable ones reported in the error.
func (d *Dir) oldestFirst(keep func(TaskRecord) bool) ([]TaskRecord, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	recs, err := d.all()
	out := slices.DeleteFunc(recs, func(r TaskRecord) bool { return !keep(r) })
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.Before(out[j].StartedAt)
		}
		return out[i].TaskID < out[j].TaskID
	})
	return out, err
}

// Prune deletes posted records whose ExpiresAt+keep is before now and
// returns how many it deleted. Unposted records (including tasks begun but
// without a result) and unreadable ones are never deleted; keep should
// outlast the server's redelivery window so that the replay cache still
// recognises a requeued task.
func (d *Dir) Prune(now time.Time, keep time.Duration) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	recs, err := d.all()
	errs := []error{err}
	n := 0
	for _, r := range recs {
		if !r.Posted || !r.ExpiresAt.Add(keep).Before(now) {
			continue
		}
		if err := os.Remove(filepath.Join(d.tasksPath(), recordName(r.TaskID))); err != nil {
			errs = append(errs, fmt.Errorf("statedir: prune task %s: %w", r.TaskID, err))
			continue
		}
		n++
	}
	if n > 0 {
		if err := atomicfile.SyncDir(d.tasksPath()); err != nil {
			errs = append(errs, fmt.Errorf("statedir: fsync tasks dir: %w", err))
		}
	}
	return n, errors.Join(errs...)
}
