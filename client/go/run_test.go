package idem

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func okFn(calls *int32, body string) RunFunc {
	return func(ctx context.Context, token uint64) (*Response, error) {
		atomic.AddInt32(calls, 1)
		return &Response{Status: 201, Header: http.Header{"Content-Type": {"text/plain"}},
			Body: []byte(body)}, nil
	}
}

func TestRunOnceThenReplay(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	var calls int32
	res, err := c.Run(context.Background(), "run-1", orderReq, okFn(&calls, "charged"))
	if err != nil || !res.Ran || res.Replayed || res.Token == 0 || res.Completion != Succeeded {
		t.Fatalf("first: %+v, %v", res, err)
	}
	again, err := c.Run(context.Background(), "run-1", orderReq, okFn(&calls, "charged twice"))
	if err != nil || again.Ran || !again.Replayed {
		t.Fatalf("second: %+v, %v", again, err)
	}
	mustEqual(t, "calls", atomic.LoadInt32(&calls), 1)
	mustEqual(t, "replayed body", string(again.Response.Body), "charged")
	mustEqual(t, "replayed status", again.Response.Status, 201)
	// The complete carried fn's response and the claim's token.
	comp := f.callsTo("/v1/claims/complete")
	var tb tokenBody
	json.Unmarshal(comp[0].Body, &tb)
	if tb.Token != res.Token || tb.Outcome != Succeeded || *tb.Response.Body != "charged" ||
		tb.Response.Headers["content-type"] != "text/plain" {
		t.Fatalf("complete body %s", comp[0].Body)
	}
}

func TestRunConcurrentRunsOnce(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	var calls int32
	fn := func(ctx context.Context, token uint64) (*Response, error) {
		atomic.AddInt32(&calls, 1)
		time.Sleep(100 * time.Millisecond)
		return &Response{Status: 200, Body: []byte("once")}, nil
	}
	var wg sync.WaitGroup
	var ran, replayed int32
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Run(context.Background(), "run-c", orderReq, fn)
			if err != nil || string(res.Response.Body) != "once" {
				t.Errorf("run: %+v, %v", res, err)
				return
			}
			if res.Ran {
				atomic.AddInt32(&ran, 1)
			}
			if res.Replayed {
				atomic.AddInt32(&replayed, 1)
			}
		}()
	}
	wg.Wait()
	mustEqual(t, "fn calls", calls, 1)
	mustEqual(t, "ran, replayed", []int32{ran, replayed}, []int32{1, 15})
}

// A 300 ms lease through a 1 s function: renewed every third of it, and another attempt
// finds the key in progress throughout (the fake lets a lease lapse into lease_expired).
func TestRunRenewsLease(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	req := orderReq
	req.Lease = 300 * time.Millisecond
	var seen []error
	fn := func(ctx context.Context, token uint64) (*Response, error) {
		for i := 0; i < 4; i++ {
			time.Sleep(250 * time.Millisecond)
			_, err := c.Claim(ctx, "run-r", orderReq)
			seen = append(seen, err)
		}
		return &Response{Status: 200}, nil
	}
	res, err := c.Run(context.Background(), "run-r", req, fn)
	if err != nil || res.Renewals < 3 || res.LeaseLapsed {
		t.Fatalf("run: %+v, %v", res, err)
	}
	for i, e := range seen {
		if !errors.Is(e, ErrInProgress) {
			t.Fatalf("concurrent claim %d: %v", i, e)
		}
	}
	renews := f.callsTo("/v1/claims/renew")
	for i, r := range renews {
		var tb tokenBody
		json.Unmarshal(r.Body, &tb)
		if tb.Token != res.Token || tb.LeaseMS != 300 {
			t.Fatalf("renew %d: %s", i, r.Body)
		}
	}
	// Control: without renewals the same lease lapses.
	cl, err := c.Claim(context.Background(), "run-r2", req)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if _, err := c.Claim(context.Background(), "run-r2", orderReq); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("control: %v (token %d)", err, cl.Token)
	}
}

// A Run whose claim repeats an earlier claim of its own attempt (an answer it lost) keeps
// the lease that claim got, most of it gone: the first renewal comes before that lease ends,
// not a third of a fresh lease after Run's claim, and no other attempt finds it expired.
// (LeaseLapsed may be set: what is left of the lease is known only to the second.)
func TestRunRenewsOnTheLeaseLeft(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	req := orderReq
	req.AttemptID = "run-left-1"
	req.Lease = 2 * time.Second
	first := time.Now()
	if _, err := c.Claim(context.Background(), "run-left", req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the caller tries again, with the same attempt
	var other error
	res, err := c.Run(context.Background(), "run-left", req,
		func(ctx context.Context, token uint64) (*Response, error) {
			time.Sleep(700 * time.Millisecond) // past the first claim's lease
			_, other = c.Claim(ctx, "run-left", orderReq)
			return &Response{Status: 200}, nil
		})
	if err != nil || res.Renewals == 0 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	if !errors.Is(other, ErrInProgress) {
		t.Fatalf("another attempt's claim while fn ran: %v", other)
	}
	renews := f.callsTo("/v1/claims/renew")
	if len(renews) == 0 || !renews[0].At.Before(first.Add(req.Lease)) {
		t.Fatalf("first renewal %v after the first claim; its lease ended after %v",
			renews[0].At.Sub(first), req.Lease)
	}
}

// With Lease 0 (the tenant's), each renewal's answer times the next, a third of the lease it
// reports (the fake's 30 s, by lease_expires_at against its Date) after it. When Run's
// claim repeats one of its own attempt that kept under a second of its lease (its answer's
// Date says so), the first renewal goes at once and its answer times the next: not a
// renewal every 20 ms (each a log write) for as long as fn runs. (LeaseLapsed may be set
// then: what was left of the claim's lease is known only to the second.) And a fresh claim
// gets one renewal through a 1 s function, not one every third of the 1 s guess.
func TestRunRenewsByEachRenewalsLease(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	ctx := context.Background()
	sleepFn := func(d time.Duration) RunFunc {
		return func(ctx context.Context, token uint64) (*Response, error) {
			time.Sleep(d)
			return &Response{Status: 200}, nil
		}
	}
	req := orderReq
	req.AttemptID = "run-tenant-1"
	short := req
	short.Lease = 300 * time.Millisecond
	if _, err := c.Claim(ctx, "run-tenant-1", short); err != nil {
		t.Fatal(err)
	}
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if r.URL.Path == "/v1/claims" { // a Date of the next second: under 1 s left
			w.Header().Set("Date", time.Now().Add(time.Second).UTC().Format(http.TimeFormat))
		}
		return false
	})
	res, err := c.Run(ctx, "run-tenant-1", req, sleepFn(600*time.Millisecond))
	if err != nil || !res.Ran || res.Renewals != 1 {
		t.Fatalf("run after a repeated claim: %+v, %v", res, err)
	}
	f.setHook(nil)

	res, err = c.Run(ctx, "run-tenant-2", orderReq, sleepFn(1100*time.Millisecond))
	if err != nil || !res.Ran || res.Renewals != 1 || res.LeaseLapsed {
		t.Fatalf("run: %+v, %v", res, err)
	}
	renews := f.callsTo("/v1/claims/renew")
	mustEqual(t, "renewals sent", len(renews), 2)
	for i, r := range renews {
		var tb tokenBody
		json.Unmarshal(r.Body, &tb)
		if tb.LeaseMS != 0 {
			t.Fatalf("renew %d asked for a lease: %s", i, r.Body)
		}
	}
}

// The lease a renewal's answer times the next by: the one asked for; else the least left
// by its Date (whole seconds: less a second); else the guess.
func TestRenewedLease(t *testing.T) {
	for _, c := range []struct {
		ask  uint64
		left time.Duration
		want uint64
	}{
		{3000, 30 * time.Second, 3000},
		{3000, 500 * time.Millisecond, 3000},
		{3000, -1, 3000},
		{0, 30500 * time.Millisecond, 29500},
		{0, time.Second, 0},
		{0, 0, 0},
		{0, -1, 1000},
	} {
		if got := renewedLease(c.ask, c.left); got != c.want {
			t.Errorf("renewedLease(%d, %v) = %d, want %d", c.ask, c.left, got, c.want)
		}
	}
}

func TestRunClassification(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	ctx := context.Background()
	boom := errors.New("card declined")

	// Retryable: released, fn's error returned, and the next Run runs again.
	_, err := c.Run(ctx, "cls-r", orderReq, func(context.Context, uint64) (*Response, error) {
		return nil, Retryable(boom)
	})
	if !errors.Is(err, boom) || !IsRetryable(err) {
		t.Fatalf("retryable: %v", err)
	}
	mustEqual(t, "after release", f.record("cls-r").state, "released")
	var calls int32
	if res, err := c.Run(ctx, "cls-r", orderReq, okFn(&calls, "ok")); err != nil || !res.Ran {
		t.Fatalf("after release: %v", err)
	}

	// Final: completed as failed_final with fn's response, which is replayed.
	res, err := c.Run(ctx, "cls-f", orderReq, func(context.Context, uint64) (*Response, error) {
		return &Response{Status: 402, Body: []byte("declined")}, Final(boom)
	})
	if err != nil || res.Completion != FailedFinal || res.Response.Status != 402 {
		t.Fatalf("final: %+v, %v", res, err)
	}
	mustEqual(t, "final record", f.record("cls-f").completion, FailedFinal)
	if res, err := c.Run(ctx, "cls-f", orderReq, okFn(&calls, "x")); err != nil || !res.Replayed ||
		res.Response.Status != 402 {
		t.Fatalf("final replay: %+v, %v", res, err)
	}

	// Any other error: completed as unknown (quarantined); typed, fn's error wrapped.
	_, err = c.Run(ctx, "cls-u", orderReq, func(context.Context, uint64) (*Response, error) {
		return nil, boom
	})
	if !errors.Is(err, ErrUnknownOutcome) || !errors.Is(err, boom) {
		t.Fatalf("unknown: %v", err)
	}
	mustEqual(t, "unknown record", f.record("cls-u").state, "quarantined")
	if _, err := c.Run(ctx, "cls-u", orderReq, okFn(&calls, "x")); !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("after quarantine: %v", err)
	}

	// A panic: completed as unknown, then raised again.
	func() {
		defer func() {
			if p := recover(); p != "kaboom" {
				t.Fatalf("recovered %v", p)
			}
		}()
		c.Run(ctx, "cls-p", orderReq, func(context.Context, uint64) (*Response, error) {
			panic("kaboom")
		})
	}()
	mustEqual(t, "panic record", f.record("cls-p").state, "quarantined")

	// A response that cannot be stored: nothing completed, FinishError with the token.
	_, err = c.Run(ctx, "cls-bad", orderReq, func(context.Context, uint64) (*Response, error) {
		return &Response{Status: 200, Body: []byte{0xff, 0xfe}}, nil
	})
	var fe *FinishError
	if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) || fe.Token == 0 {
		t.Fatalf("bad response: %v", err)
	}
	mustEqual(t, "bad response record", f.record("cls-bad").state, "processing")
	mustEqual(t, "fn calls", calls, 1)
}

func TestRunWaitsWhileInProgress(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	holder, err := c.Claim(context.Background(), "wait-1", orderReq)
	if err != nil {
		t.Fatal(err)
	}
	var calls int32
	// Until the deadline: in progress, typed both ways.
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Run(ctx, "wait-1", orderReq, okFn(&calls, "x"))
	if !errors.Is(err, ErrInProgress) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if el := time.Since(start); el > 450*time.Millisecond || el < 100*time.Millisecond {
		t.Fatalf("gave up after %v", el)
	}
	polls := len(f.callsTo("/v1/claims"))
	// The holder completes meanwhile: the waiting Run gets the replay.
	go func() {
		time.Sleep(300 * time.Millisecond)
		c.Complete(context.Background(), "wait-1", holder.Token, Succeeded, &Response{Status: 200, Body: []byte("held")})
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	res, err := c.Run(ctx2, "wait-1", orderReq, okFn(&calls, "x"))
	if err != nil || !res.Replayed || string(res.Response.Body) != "held" {
		t.Fatalf("after the holder completed: %+v, %v", res, err)
	}
	mustEqual(t, "fn calls", calls, 0)
	// All of one Run's polls carry one attempt id.
	ids := map[string]bool{}
	for _, call := range f.callsTo("/v1/claims")[polls:] {
		ids[attemptOf(t, call.Body)] = true
	}
	mustEqual(t, "attempt ids of one Run", len(ids), 1)
}

// The complete after fn ran meets a 503: the same complete again, until it is recorded.
func TestRunCompleteRetried(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	var completes int32
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if r.URL.Path == "/v1/claims/complete" && atomic.AddInt32(&completes, 1) <= 2 {
			fakeErr(w, 503, CodeUnavailable, "no leader", 0)
			return true
		}
		return false
	})
	var calls int32
	res, err := c.Run(context.Background(), "fin-1", orderReq, okFn(&calls, "done"))
	if err != nil || !res.Ran {
		t.Fatalf("%+v, %v", res, err)
	}
	comp := f.callsTo("/v1/claims/complete")
	if len(comp) != 3 || string(comp[0].Body) != string(comp[2].Body) {
		t.Fatalf("completes: %d", len(comp))
	}
	mustEqual(t, "record", f.record("fin-1").state, "completed")
}

// The caller's context ends while fn runs: fn's work is done, and is recorded all the
// same.
func TestRunFinishOutlivesCallerContext(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	ctx, cancel := context.WithCancel(context.Background())
	res, err := c.Run(ctx, "fin-2", orderReq, func(context.Context, uint64) (*Response, error) {
		cancel()
		return &Response{Status: 200, Body: []byte("done")}, nil
	})
	if err != nil || !res.Ran {
		t.Fatalf("%+v, %v", res, err)
	}
	mustEqual(t, "record", f.record("fin-2").state, "completed")
}

// A renewal answers lease_lost (another attempt took over): fn's context is cancelled,
// and the complete that follows fails typed.
func TestRunLeaseLost(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if r.URL.Path == "/v1/claims/renew" {
			f.mu.Lock()
			f.recs["lost-1"].token++ // taken over
			f.mu.Unlock()
			fakeErr(w, 409, CodeLeaseLost, "not the holder", 0)
			return true
		}
		return false
	})
	req := orderReq
	req.Lease = 150 * time.Millisecond
	_, err := c.Run(context.Background(), "lost-1", req, func(ctx context.Context, _ uint64) (*Response, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(3 * time.Second):
			return &Response{Status: 200}, nil
		}
	})
	var fe *FinishError
	if !errors.As(err, &fe) || !fe.LeaseLost || !errors.Is(err, ErrLeaseLost) ||
		!errors.Is(fe.FnErr, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}
