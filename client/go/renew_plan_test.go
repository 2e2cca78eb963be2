package idem

import "testing"

// The cases of proto/renew_plan.h's rule, worked out by hand from its text.
func TestRenewPlan(t *testing.T) {
	cases := []struct {
		now, lease, end, lastOK uint64
		failed, first           bool
		at, dl                  uint64
	}{
		// A third of the lease after the last success; the deadline: the lease left then
		// less an eighth of the interval, at most the interval.
		{0, 3000, 3000, 0, false, true, 1000, 1000},
		// After a failure: an eighth of the interval from now.
		{1000, 3000, 3000, 0, true, false, 1125, 1000},
		// A long lease: deadlines capped at 2 s.
		{0, 30000, 30000, 0, false, true, 10000, 2000},
		// The claim's lease almost over (a holder's own retry): at once.
		{100, 1000, 110, 0, false, true, 100, 100},
		// A granted lease that short is not renewed back to back (first is false).
		{100, 1000, 110, 0, false, false, 333, 100},
		// Tiny leases: the 20 ms floor of the interval and the 100 ms floor of a deadline.
		{0, 30, 30, 0, false, true, 20, 100},
		// A renewal already late: now, with what is left less the retry.
		{5000, 3000, 5500, 1000, false, false, 5000, 375},
	}
	for i, c := range cases {
		at, dl := renewPlan(c.now, c.lease, c.end, c.lastOK, c.failed, c.first)
		if at != c.at || dl != c.dl {
			t.Errorf("case %d: at %d dl %d, want %d %d", i, at, dl, c.at, c.dl)
		}
	}
}
