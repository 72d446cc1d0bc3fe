package safety

import (
	"math"
	"testing"
	"time"
)

func TestFmtDur(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    time.Duration
		want string
	}{
		{"milliseconds", 1499 * time.Microsecond, "1ms"},
		{"seconds", 2346 * time.Millisecond, "2.35s"},
		{"negative", -20 * time.Millisecond, "−20ms"},
		{"since_a_zero_time", time.Time{}.Sub(time.Now()), "never"},
		{"smallest", math.MinInt64, "never"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FmtDur(tc.d); got != tc.want {
				t.Errorf("FmtDur(%d) = %q, want %q", tc.d, got, tc.want)
			}
		})
	}
}
