package idem

// renewPlan is proto/renew_plan.h in Go: the one rule of lease renewals that libidem's
// idem_run and the proxy follow. Times are milliseconds of one monotonic clock.
//
// Given the time now, the lease (ms), the time by which it ends and when the last renewal
// that succeeded was sent, whether the last try failed and whether none has succeeded yet
// (first: the lease is the claim's): the time of the next renewal (a third of the lease
// after the last success, at least renewMinInterval; an eighth of that after a failure,
// since the lease may have only that long left; at once when the claim's lease has less
// than renewMinInterval left) and its deadline (the lease left then less that eighth, or
// all of it when less; at most a third of the lease and renewAttemptMax, at least
// renewMinDeadline).
const (
	renewMinInterval = 20
	renewAttemptMax  = 2000
	renewMinDeadline = 100
)

func renewPlan(now, leaseMS, leaseEnd, lastOK uint64, failed, first bool) (at, deadlineMS uint64) {
	interval := leaseMS / 3
	if interval < renewMinInterval {
		interval = renewMinInterval
	}
	retry := interval / 8
	if retry < renewMinInterval {
		retry = renewMinInterval
	}
	when := lastOK + interval
	if failed {
		when = now + retry
	}
	if first && !failed && (leaseEnd <= now || leaseEnd-now < renewMinInterval) {
		// The claim left less than the floor (a holder's own retry of its claim answers
		// with what it has left): renew at once, not after the lease ended.
		when = now
	}
	at = when
	if at < now {
		at = now
	}
	var left uint64
	if leaseEnd > at {
		left = leaseEnd - at
	}
	dl := left
	if left > retry {
		dl = left - retry
	}
	if dl > interval {
		dl = interval
	}
	if dl > renewAttemptMax {
		dl = renewAttemptMax
	}
	if dl < renewMinDeadline {
		dl = renewMinDeadline
	}
	return at, dl
}
