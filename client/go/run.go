package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// leaseGuess: the lease Run's first renewal is timed by when the claim asked for none (the
// tenant's, which a claim's answer does not report), as libidem does with a node that does
// not say: a third of a second after the claim. Each renewal's answer then times the next
// by the lease it reports (renewedLease).
const leaseGuess = time.Second

// RunFunc is the business function Run calls at most once per key. token is the fencing
// token: pass it to downstream systems that reject stale holders. ctx is Run's, and is
// also cancelled if a lease renewal finds the lease lost (another attempt took over).
//
// What it returns decides what is recorded (docs/contract.md, "The caller classifies its
// failures"):
//
//	resp, nil                 complete "succeeded" with resp: every retry replays it
//	resp, Final(err)          complete "failed_final" with resp: a failure with side
//	                          effects, replayed to every retry as well
//	_, Retryable(err)         release: nothing happened, the next try runs again
//	_, any other error        complete "unknown": the outcome is not known, and the key is
//	                          quarantined until an operator resolves it (so is a nil resp
//	                          with a nil error, and a panic, which Run then re-raises)
type RunFunc func(ctx context.Context, token uint64) (*Response, error)

type classified struct {
	how Completion // FailedFinal, or "" for retryable
	err error
}

func (e *classified) Error() string {
	if e.how == FailedFinal {
		return "final failure: " + e.err.Error()
	}
	return "retryable failure: " + e.err.Error()
}
func (e *classified) Unwrap() error { return e.err }

// Retryable marks fn's error as a failure that changed nothing: Run releases the key and
// returns this error; the next try runs fn again. err must not be nil.
func Retryable(err error) error { return &classified{err: err} }

// Final marks fn's error as a final failure with side effects: Run completes the key as
// failed_final with fn's response, which every retry gets replayed. err must not be nil.
func Final(err error) error { return &classified{how: FailedFinal, err: err} }

// IsRetryable reports whether err was marked by Retryable.
func IsRetryable(err error) bool {
	var c *classified
	return errors.As(err, &c) && c.how == ""
}

// Result is what Run returns when fn ran and its response was recorded, or when the key
// was already completed (Replayed).
type Result struct {
	Response   *Response
	Replayed   bool       // the stored response of an earlier run; fn did not run
	Ran        bool       // fn ran in this call
	Token      uint64     // fn's fencing token (when it ran)
	Completion Completion // Succeeded or FailedFinal (when it ran)
	Renewals   int        // lease renewals answered ok while fn ran
	// LeaseLapsed: no renewal was answered before the lease ran out while fn ran, so
	// another attempt could have taken over meanwhile (its response was recorded all the
	// same: nobody had).
	LeaseLapsed bool
}

// FinishError is Run's error when fn ran but its outcome was not recorded: the complete or
// release that followed failed (errors.Is(err, ErrUnavailable) after its retries, or
// ErrLeaseLost, ErrQuotaExceeded, ErrInvalid: a response that cannot be stored; Err says).
// The key stays processing until its lease ends, unless the caller completes or releases
// it with Token itself. The business effect of fn happened (or, for a release, did not):
// do not run it again on a guess.
type FinishError struct {
	Op          string     // "complete" or "release"
	Completion  Completion // the complete's outcome
	Token       uint64
	Response    *Response // fn's response
	FnErr       error     // fn's own error, when it returned one
	LeaseLost   bool      // a renewal answered that the lease was lost
	LeaseLapsed bool      // no renewal answered before the lease ran out
	Err         error     // the complete's or release's error
}

func (e *FinishError) Error() string {
	var notes []string
	if e.LeaseLost {
		notes = append(notes, "lease lost while fn ran")
	} else if e.LeaseLapsed {
		notes = append(notes, "lease may have lapsed while fn ran")
	}
	if e.FnErr != nil {
		notes = append(notes, "fn: "+e.FnErr.Error())
	}
	what := e.Op
	if e.Op == "complete" {
		what += " (" + string(e.Completion) + ")"
	}
	s := fmt.Sprintf("idem: fn ran (token %d) but its %s failed: %v", e.Token, what, e.Err)
	if len(notes) > 0 {
		s += " [" + strings.Join(notes, "; ") + "]"
	}
	return s
}

func (e *FinishError) Unwrap() error { return e.Err }

// Run runs fn at most once per key, across every process that uses the same key and
// cluster, as libidem's idem_run does:
//
//   - claim (req names the request and the claim's options; a fresh attempt id unless it
//     has one). A claim whose answer was lost is retried with the same attempt id.
//   - acquired: fn runs while a goroutine renews the lease every third of it (of
//     req.Lease; when it is 0, of the tenant's lease as each renewal's answer reports it,
//     lease_expires_at against its Date, and of 1 s before the first: the claim's answer
//     does not report it), an eighth of that after a renewal that failed, each try
//     bounded by the lease left (the rule of proto/renew_plan.h); then, by what fn
//     returned, complete or release (see RunFunc), retried through leader changes for
//     Options.FinishTimeout.
//   - replay: fn does not run; the Result holds the stored response, Replayed.
//   - in progress (another attempt holds the key): polled with backoff until ctx's
//     deadline (Options.Timeout when it has none), then an error that is both
//     ErrInProgress and context.DeadlineExceeded; a replay or an acquired claim ends it.
//   - anything else (ErrMismatch, ErrLeaseExpired, ErrUnknownOutcome, ErrExpired,
//     ErrQuotaExceeded, ErrUnavailable, ...): that *Error; fn did not run.
//
// After fn ran: (Result, nil) when its response was recorded; fn's error (Retryable) after
// a release; an *Error that is ErrUnknownOutcome (wrapping fn's error) after a complete
// "unknown"; a *FinishError when the complete or release failed.
func (c *Client) Run(ctx context.Context, key string, req Request, fn RunFunc) (*Result, error) {
	if fn == nil {
		return nil, invalidError("run", CodeInvalidRequest, "nil function")
	}
	if req.AttemptID == "" {
		req.AttemptID = NewAttemptID()
	}
	wctx, cancel := c.callContext(ctx)
	defer cancel()
	cl, sent, err := c.claimWait(wctx, key, req)
	if err != nil {
		return nil, err
	}
	if cl.Replayed {
		return &Result{Response: cl.Response, Replayed: true}, nil
	}
	return c.runClaimed(ctx, key, req.Lease, cl.leaseLeft, cl.Token, sent, fn)
}

// claimWait claims, and claims again with the same attempt id while the key is in
// progress, with backoff, until ctx's deadline. Returns the answer and when the claim
// that got it was sent.
func (c *Client) claimWait(ctx context.Context, key string, req Request) (*Claimed, time.Time, error) {
	for try := 2; ; try++ {
		sent := time.Now()
		cl, err := c.Claim(ctx, key, req)
		var e *Error
		if err == nil || !errors.As(err, &e) || !errors.Is(err, ErrInProgress) {
			return cl, sent, err
		}
		wait := c.backoff(try)
		dl, _ := ctx.Deadline()
		if time.Until(dl) < wait+minAttemptTimeout || !sleep(ctx, wait) {
			out := *e
			out.Op = "run"
			out.Err = context.DeadlineExceeded
			if ctx.Err() != nil {
				out.Err = ctx.Err()
			}
			return nil, sent, &out
		}
	}
}

// runClaimed runs fn under the claim of token (sent: when the claim that acquired it was
// sent; left: its answer's lease end less its Date, Claimed.leaseLeft), renewing the lease
// meanwhile, then records fn's outcome.
func (c *Client) runClaimed(ctx context.Context, key string, lease, left time.Duration,
	token uint64, sent time.Time, fn RunFunc) (*Result, error) {
	fctx, cancelFn := context.WithCancel(ctx)
	defer cancelFn()
	r := startRenewer(c, key, token, lease, left, sent, cancelFn)
	resp, ferr, panicked := callFn(fctx, fn, token)
	r.halt()

	how, class := Unknown, ferr
	var cl *classified
	switch {
	case panicked != nil:
		class = fmt.Errorf("fn panicked: %v", panicked)
	case ferr == nil && resp != nil:
		how = Succeeded
	case ferr == nil:
		class = errors.New("fn returned neither a response nor an error")
	case errors.As(ferr, &cl) && cl.how == "":
		how = "" // release
	case errors.As(ferr, &cl) && cl.how == FailedFinal && resp != nil:
		how = FailedFinal
	}

	fin, cancel := c.finishContext(ctx)
	defer cancel()
	fe := &FinishError{Op: "complete", Completion: how, Token: token, Response: resp,
		FnErr: ferr, LeaseLost: r.lost, LeaseLapsed: r.lapsed}
	var err error
	switch how {
	case "":
		fe.Op = "release"
		err = c.Release(fin, key, token)
	case Unknown:
		err = c.Complete(fin, key, token, Unknown, nil)
	default:
		err = c.Complete(fin, key, token, how, resp)
	}
	if panicked != nil {
		panic(panicked)
	}
	if err != nil {
		fe.Err = err
		return nil, fe
	}
	switch how {
	case "":
		return nil, ferr
	case Unknown:
		return nil, &Error{Op: "run", Code: CodeOutcomeUnknown, Err: class,
			Message: "fn's outcome is unknown: the key is quarantined until an operator resolves it"}
	}
	return &Result{Response: resp, Ran: true, Token: token, Completion: how,
		Renewals: r.renewals, LeaseLapsed: r.lapsed}, nil
}

// callFn calls fn, catching a panic (returned, for Run to re-raise once the key is
// completed as unknown).
func callFn(ctx context.Context, fn RunFunc, token uint64) (resp *Response, err error, panicked interface{}) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	resp, err = fn(ctx, token)
	return resp, err, nil
}

// finishContext: the complete or release after fn ran is not cut short by the caller's
// context (its work is done and must be recorded): Options.FinishTimeout, or ctx's
// deadline when later.
func (c *Client) finishContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := c.opts.FinishTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) > d {
		d = time.Until(dl)
	}
	return context.WithTimeout(context.Background(), d)
}

// renewer renews a lease while fn runs (renewPlan), on a monotonic clock: milliseconds
// since the claim was sent.
type renewer struct {
	c      *Client
	key    string
	token  uint64
	askMS  uint64 // sent with each renewal; 0: the tenant's
	base   time.Time
	onLost func()

	stop chan struct{}
	done chan struct{}

	// Written by the renewer's goroutine; read after halt().
	estMS, endMS, lastOK uint64
	renewals             int
	lost, lapsed         bool
}

func startRenewer(c *Client, key string, token uint64, lease, left time.Duration,
	sent time.Time, onLost func()) *renewer {
	ask := uint64(lease.Milliseconds())
	est := ask
	if est == 0 {
		est = uint64(leaseGuess.Milliseconds())
	}
	if left >= 0 && uint64(left.Milliseconds()) < est {
		// Even the most the answer allows for is short of the lease asked for: a claim its
		// own attempt repeated kept the lease it had. The first renewal is timed by the
		// least that may be left of it (Date has whole seconds), not by a fresh lease.
		est = 0
		if left > time.Second {
			est = uint64((left - time.Second).Milliseconds())
		}
	}
	r := &renewer{c: c, key: key, token: token, askMS: ask, base: sent, onLost: onLost,
		stop: make(chan struct{}), done: make(chan struct{}), estMS: est, endMS: est}
	go r.loop()
	return r
}

func (r *renewer) now() uint64 { return uint64(time.Since(r.base).Milliseconds()) }

func (r *renewer) loop() {
	defer close(r.done)
	stopCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-stopCtx.Done():
		}
	}()
	failed := false
	for !r.lost {
		now := r.now()
		at, dl := renewPlan(now, r.estMS, r.endMS, r.lastOK, failed, r.renewals == 0)
		if !sleep(stopCtx, time.Duration(at-now)*time.Millisecond) {
			break
		}
		sent := r.now()
		rctx, rcancel := context.WithTimeout(stopCtx, time.Duration(dl)*time.Millisecond)
		_, left, err := r.c.renew(rctx, r.key, r.token, time.Duration(r.askMS)*time.Millisecond)
		rcancel()
		if stopCtx.Err() != nil {
			break // halted: the complete or release supersedes this renewal
		}
		back := r.now()
		failed = err != nil
		switch {
		case err == nil:
			r.renewals++
			if back > r.endMS {
				r.lapsed = true // renewed, but after the lease had ended
			}
			// Each answer times the next renewal, a third of the lease it granted after it
			// (the claim's may have been only what was left of a lease, on a holder's own
			// retry), as libidem follows the lease each answer reports.
			r.estMS = renewedLease(r.askMS, left)
			// The lease runs from when the node applied the renewal, after it was sent:
			// counting from the send is on the safe side.
			r.lastOK = sent
			r.endMS = sent + r.estMS
		case errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound):
			r.lost = true
			r.onLost()
		}
	}
	if !r.lost && r.now() > r.endMS {
		r.lapsed = true
	}
}

// renewedLease: the lease (ms) a renewal granted, by which the next is timed. The lease
// asked for (askMS), which a renewal grants in full from when the node applied it; when
// none was (the tenant's, which the JSON API does not report), the least that may be left
// of it by the answer (left: its lease end less its Date, Claimed.leaseLeft; Date has whole
// seconds, so that less a second), or leaseGuess when the answer has no Date.
func renewedLease(askMS uint64, left time.Duration) uint64 {
	switch {
	case askMS != 0:
		return askMS
	case left < 0:
		return uint64(leaseGuess.Milliseconds())
	case left <= time.Second:
		return 0
	}
	return uint64((left - time.Second).Milliseconds())
}

// halt stops the renewer (a renewal in flight is abandoned) and waits for it.
func (r *renewer) halt() {
	close(r.stop)
	<-r.done
}
