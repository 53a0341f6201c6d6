package sqlite

import (
	"strings"
	"testing"

	"github.com/drover-dev/drover/internal/cp/store/sqlstore"
)

// TestHostStatesSinceUsesIndex: the host cache's refresh of changes finds
// the changed hosts through index hosts_updated_at. A scan of the table
// (a plan SQLite picks for an ORDER BY id) read every host, capabilities
// included, each refresh: 5 ms at 20,000 hosts where the index takes
// 0.05 ms (BenchmarkHostCache).
func TestHostStatesSinceUsesIndex(t *testing.T) {
	s, err := Open(t.Context(), t.TempDir()+"/d.db")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plan := queryPlan(t, s, sqlstore.HostStatesSinceSQL, 0)
	if len(plan) != 1 || !strings.HasPrefix(plan[0].detail, "SEARCH hosts USING INDEX hosts_updated_at") {
		t.Fatalf("plan:\n%s", planText(plan))
	}
}

// TestTouchHostsReadsBatchOnce: each of touchHosts' statements reads the
// batch (json_each) once, whatever the hosts' statuses: as the outermost
// loop, or in a subquery evaluated once. A plan that reads it inside the
// loop over hosts parses the whole batch again for each host that loop
// visits (the stale hosts, for the revive): quadratic, seconds of the
// single writer per flush when a fleet comes back after a restart.
func TestTouchHostsReadsBatchOnce(t *testing.T) {
	s, err := Open(t.Context(), t.TempDir()+"/d.db")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for name, q := range map[string]string{"revive": reviveHosts, "raise last seen": raiseLastSeen} {
		plan := queryPlan(t, s, q, `[]`, 0)
		if msg := batchReadOnce(plan); msg != "" {
			t.Errorf("%s: %s; plan:\n%s", name, msg, planText(plan))
		}
	}
}

type planRow struct {
	id, parent int
	detail     string
}

func queryPlan(t *testing.T, s *Store, q string, args ...any) []planRow {
	t.Helper()
	rows, err := s.db.r.QueryContext(t.Context(), "EXPLAIN QUERY PLAN "+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []planRow
	for rows.Next() {
		var r planRow
		var notUsed int
		if err := rows.Scan(&r.id, &r.parent, &notUsed, &r.detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}

// batchReadOnce says what is wrong with plan, or "": json_each must be
// the first loop of the statement, or sit in a subquery SQLite lists or
// materialises once.
func batchReadOnce(plan []planRow) string {
	byID := make(map[int]planRow, len(plan))
	for _, r := range plan {
		byID[r.id] = r
	}
	for i, r := range plan {
		if !strings.Contains(r.detail, "json_each") {
			continue
		}
		if r.parent != 0 {
			p := byID[r.parent].detail
			if strings.HasPrefix(p, "LIST SUBQUERY") || strings.HasPrefix(p, "MATERIALIZE") {
				return ""
			}
			return "json_each under " + p
		}
		for _, before := range plan[:i] {
			if before.parent == 0 && (strings.HasPrefix(before.detail, "SCAN") || strings.HasPrefix(before.detail, "SEARCH")) {
				return "json_each runs inside the loop " + before.detail
			}
		}
		return ""
	}
	return "no json_each in the plan"
}

func planText(plan []planRow) string {
	var b strings.Builder
	for _, r := range plan {
		b.WriteString("    " + r.detail + "\n")
	}
	return b.String()
}
