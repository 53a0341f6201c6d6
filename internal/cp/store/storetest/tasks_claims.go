package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/drover-dev/drover/internal/cp/store"
	"github.com/drover-dev/drover/internal/wire/api"
)

// The claims of several tasks at once join the task cases.
func init() {
	taskCases = append(taskCases,
		testCase{"Task/ClaimTasks", testClaimTasks},
		testCase{"Task/ClaimTasksDisabledHost", testClaimTasksDisabledHost},
		testCase{"Task/ClaimTasksConcurrent", testClaimTasksConcurrent},
	)
}

// claimIDs claims up to max tasks of node at now and returns their ids in
// the order the store gave them, after checking each is stored as returned.
func claimIDs(t *testing.T, s store.Store, node string, now time.Duration, leases store.ClaimLeases, max int) []string {
	t.Helper()
	got, err := s.ClaimTasks(ctxT(t), node, at(now), leases, max, nil)
	must(t, err)
	ids := []string{}
	for _, task := range got {
		if task.NodeID != node || task.State != api.TaskDispatched || task.Attempts != 1 ||
			!task.DispatchedAt.Equal(at(now)) {
			t.Fatalf("claimed task %+v", task)
		}
		diff(t, "stored claimed task", getTask(t, s, task.ID), task)
		ids = append(ids, task.ID)
	}
	return ids
}

// testClaimTasks: up to max of the node's oldest claimable tasks, oldest
// first, each with its type's lease; expired tasks and other nodes' tasks
// are left alone; max < 1 claims one.
func testClaimTasks(t *testing.T, s store.Store) {
	echo := newTask("echo", "n1", 2*time.Second)
	echo.Type = "diag.echo"
	old := newTask("old", "n1", 0)
	old.ExpiresAt = at(5 * time.Second)
	enqueue(t, s,
		newTask("late", "n1", 4*time.Second),
		newTask("early", "n1", time.Second),
		newTask("mid-b", "n1", 3*time.Second),
		newTask("mid-a", "n1", 3*time.Second),
		echo, old,
		newTask("first", "n1", 500*time.Millisecond),
		newTask("other", "n2", 0),
	)
	leases := store.ClaimLeases{Default: at(time.Hour), ByType: map[string]time.Time{"diag.health_probe": at(time.Minute)}}
	diff(t, "first claim", claimIDs(t, s, "n1", 10*time.Second, leases, 0), []string{"first"})
	diff(t, "second claim", claimIDs(t, s, "n1", 10*time.Second, leases, 3), []string{"early", "echo", "mid-a"})
	diff(t, "third claim", claimIDs(t, s, "n1", 10*time.Second, leases, 10), []string{"mid-b", "late"})
	diff(t, "claim of an empty queue", claimIDs(t, s, "n1", 10*time.Second, leases, 10), []string{})
	for id, lease := range map[string]time.Time{"early": at(time.Minute), "echo": at(time.Hour)} {
		if got := getTask(t, s, id).LeaseExpiresAt; !got.Equal(lease) {
			t.Errorf("task %s lease %s, want %s", id, got, lease)
		}
	}
	for _, id := range []string{"old", "other"} {
		if getTask(t, s, id).State != api.TaskQueued {
			t.Errorf("task %s claimed", id)
		}
	}
}

// testClaimTasksDisabledHost: a disabled or revoked host gets none of its
// tasks, however many it asks for.
func testClaimTasksDisabledHost(t *testing.T, s store.Store) {
	createOffAndGone(t, s)
	enqueue(t, s, newTask("off-1", "off", 0), newTask("off-2", "off", 0), newTask("gone-1", "gone", 0))
	leases := store.ClaimLeases{Default: at(time.Minute)}
	for _, node := range []string{"off", "gone"} {
		diff(t, "claims of "+node, claimIDs(t, s, node, time.Second, leases, 5), []string{})
	}
}

// testClaimTasksConcurrent: 8 claimers of one node take up to 7 tasks at a
// time, alternating with single claims, until 300 tasks are gone; each task
// is claimed exactly once.
func testClaimTasksConcurrent(t *testing.T, s store.Store) {
	ctx := ctxT(t)
	leases := store.ClaimLeases{Default: at(time.Minute)}
	drainOnce(t, s, 300, 8, func(w, i int) ([]store.Task, error) {
		max := 7
		if (w+i)%2 == 0 {
			max = 1
		}
		got, err := s.ClaimTasks(ctx, "n1", at(time.Second), leases, max, nil)
		if err == nil && len(got) > max {
			err = fmt.Errorf("claimed %d tasks, asked for at most %d", len(got), max)
		}
		return got, err
	})
}
