package bench

import "testing"

func TestParseExplain(t *testing.T) {
	t.Parallel()

	t.Run("an index scan under a limit reads the lifecycle's index", func(t *testing.T) {
		raw := `[{"Plan": {"Node Type": "Limit", "Plan Rows": 500, "Actual Rows": 500, "Shared Hit Blocks": 504, "Shared Read Blocks": 2,
			"Plans": [{"Node Type": "Index Scan", "Index Name": "sandboxes_lifecycle_due", "Relation Name": "sandboxes", "Plan Rows": 33333, "Actual Rows": 500}]},
			"Planning Time": 0.274, "Execution Time": 1.074}]`
		e, err := parseExplain([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		if e.Plan != "Limit → Index Scan using sandboxes_lifecycle_due on sandboxes" || !e.UsesIndex || e.SeqScan {
			t.Errorf("plan %q, index %v, seq scan %v", e.Plan, e.UsesIndex, e.SeqScan)
		}
		if e.ExecMS != 1.074 || e.PlanMS != 0.274 || e.Rows != 500 || e.Buffers != 506 || e.Estimated != 33333 {
			t.Errorf("parsed %+v", e)
		}
	})
	t.Run("a seq scan of sandboxes is seen, whatever else the plan reads", func(t *testing.T) {
		raw := `[{"Plan": {"Node Type": "Limit", "Plans": [{"Node Type": "Sort", "Plans": [
			{"Node Type": "Seq Scan", "Relation Name": "sandboxes"},
			{"Node Type": "Bitmap Index Scan", "Index Name": "sandboxes_by_client_created"}]}]}, "Execution Time": 3}]`
		e, err := parseExplain([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		if e.UsesIndex || !e.SeqScan || e.Plan != "Limit → Sort → (Seq Scan on sandboxes; Bitmap Index Scan using sandboxes_by_client_created)" {
			t.Errorf("plan %q, index %v, seq scan %v", e.Plan, e.UsesIndex, e.SeqScan)
		}
	})
	t.Run("an answer that is not EXPLAIN's JSON is an error", func(t *testing.T) {
		if _, err := parseExplain([]byte(`QUERY PLAN`)); err == nil {
			t.Error("no error")
		}
	})
}
