package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEnumeratedLabels: a reason the schema does not know (a lock stored
// without it) counts as other rather than adding a series of its own.
func TestEnumeratedLabels(t *testing.T) {
	for _, v := range []EnumCounterVec{TransitionsObserved, EventsSuppressed} {
		before := testutil.CollectAndCount(v.vec)
		v.WithLabelValues("Expired").Inc()
		for _, junk := range []string{"Bogus", "expired", "Expired\x1b[2J", string(make([]byte, 100<<10))} {
			v.WithLabelValues(junk).Inc()
		}
		if got := testutil.ToFloat64(v.WithLabelValues(Other)); got < 4 {
			t.Errorf("other = %v, want at least the 4 unknown reasons", got)
		}
		if after := testutil.CollectAndCount(v.vec); after > before+2 {
			t.Errorf("series %d -> %d: unknown reasons added series", before, after)
		}
	}
}
