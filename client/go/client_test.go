package idem

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var orderReq = Request{Method: "POST", Path: "/orders?b=2&a=1", Body: map[string]interface{}{"amount": 10}}

func TestClaimCompleteReplay(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	ctx := context.Background()
	cl, err := c.Claim(ctx, "order-1", orderReq)
	if err != nil || !cl.Acquired || cl.Token == 0 || cl.AttemptID == "" {
		t.Fatalf("claim: %+v, %v", cl, err)
	}
	// A stored 409 with a JSON body that looks like an error is a replay, not an error.
	stored := &Response{Status: 409, Header: http.Header{"Content-Type": {"application/json"},
		"X-Custom": {"kept"}}, Body: []byte(`{"code":"idempotency_key_reused"}`)}
	if err := c.Complete(ctx, "order-1", cl.Token, FailedFinal, stored); err != nil {
		t.Fatal(err)
	}
	// Repeating the same complete answers ok; another outcome answers lease_lost.
	if err := c.Complete(ctx, "order-1", cl.Token, FailedFinal, stored); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, "order-1", cl.Token, Unknown, nil); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("other outcome: %v", err)
	}
	again, err := c.Claim(ctx, "order-1", orderReq)
	if err != nil || !again.Replayed || again.Acquired {
		t.Fatalf("second claim: %+v, %v", again, err)
	}
	r := again.Response
	mustEqual(t, "status", r.Status, 409)
	mustEqual(t, "body", string(r.Body), string(stored.Body))
	mustEqual(t, "content-type", r.Header.Get("Content-Type"), "application/json")
	mustEqual(t, "custom", r.Header.Get("X-Custom"), "kept")
	for _, h := range []string{"Idempotency-Replayed", "X-Request-Id", "X-Content-Type-Options"} {
		if r.Header.Get(h) != "" {
			t.Fatalf("idemd's own header %s kept in the stored response", h)
		}
	}
	// The same key with another body: mismatch, typed.
	_, err = c.Claim(ctx, "order-1", Request{Method: "POST", Path: "/orders", Body: "other"})
	var e *Error
	if !errors.Is(err, ErrMismatch) || !errors.As(err, &e) || e.Status != 409 ||
		e.Code != CodeMismatch || e.RequestID != "fake0001" || e.Op != "claim" {
		t.Fatalf("mismatch: %#v", err)
	}
	rec, err := c.Get(ctx, "order-1")
	if err != nil || rec.State != "completed" || rec.Token != cl.Token || rec.Response.Status != 409 {
		t.Fatalf("get: %+v, %v", rec, err)
	}
	if _, err := c.Get(ctx, "order-none"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of no record: %v", err)
	}
}

func TestClaimWire(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	_, err := c.Claim(context.Background(), "k-1", Request{Method: "POST", Path: "/p",
		Body: json.RawMessage(`{"b":1,"a":[1,2]}`), AttemptID: "att-1", Lease: 2 * time.Second,
		TTL: time.Hour, Policy: PolicyTakeover})
	if err != nil {
		t.Fatal(err)
	}
	calls := f.callsTo("/v1/claims")
	var got map[string]interface{}
	json.Unmarshal(calls[0].Body, &got)
	want := `map[attempt_id:att-1 lease_ms:2000 policy:takeover request:map[body:map[a:[1 2] b:1] method:POST path:/p] ttl_ms:3.6e+06]`
	mustEqual(t, "claim body", got, want)
	mustEqual(t, "key header", calls[0].Key, "k-1")
	// A body that is not UTF-8 cannot travel as the request's body: refused before sending.
	_, err = c.Claim(context.Background(), "k-2", Request{Method: "POST", Path: "/p", Body: []byte{0xff}})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("non-UTF-8 body: %v", err)
	}
	// So is a key outside the alphabet (it would travel in a header).
	for _, k := range []string{"", "a b", "a\nb", strings.Repeat("k", 256)} {
		if _, err := c.Claim(context.Background(), k, orderReq); !errors.Is(err, ErrInvalid) {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	if n := len(f.callsTo("/v1/claims")); n != 1 {
		t.Fatalf("%d claims sent, want 1", n)
	}
}

// A key written as an RFC 8941 sf-string ("k", as the IETF draft writes the header) is the
// key between its quotes (docs/contract.md, docs/http-api.md "Keys in headers"): the same
// key as the bare one, sent bare. A bad sf-string is refused before sending, as the gateway
// refuses it (server/http_conv.c), and so is an sf-string whose key breaks the key rule.
func TestSfStringKey(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	ctx := context.Background()
	cl, err := c.Claim(ctx, `"sf-1"`, orderReq)
	if err != nil || !cl.Acquired {
		t.Fatalf("claim: %+v, %v", cl, err)
	}
	if _, err := c.Renew(ctx, ` "sf-1"  `, cl.Token, 0); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := c.Complete(ctx, `"sf-1"`, cl.Token, Succeeded, &Response{Status: 201}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	again, err := c.Claim(ctx, "sf-1", orderReq) // bare: the same key
	if err != nil || !again.Replayed {
		t.Fatalf("bare claim: %+v, %v", again, err)
	}
	if rec, err := c.Get(ctx, `"sf-1"`); err != nil || rec.Token != cl.Token {
		t.Fatalf("get: %+v, %v", rec, err)
	}
	f.mu.Lock()
	calls := append([]fakeCall(nil), f.calls...)
	f.mu.Unlock()
	for _, call := range calls {
		mustEqual(t, call.Path+": key header", call.Key, "sf-1")
	}
	for _, tc := range []struct{ key, code string }{
		{`"sf-1`, CodeKeyInvalid},        // no closing quote
		{`"sf-1\"`, CodeKeyInvalid},      // the closing quote escaped
		{`"sf-1";a=1`, CodeKeyInvalid},   // parameters
		{`"sf-1" x`, CodeKeyInvalid},     // something after the quote
		{`"sf\n1"`, CodeKeyInvalid},      // an escape of neither '"' nor '\'
		{"\"sf-\x7f1\"", CodeKeyInvalid}, // a byte outside printable ASCII
		{`"sf\"1"`, CodeKeyInvalid},      // valid, but '"' is outside the key alphabet
		{`"sf 1"`, CodeKeyInvalid},       // valid, but ' ' is too
		{`"` + strings.Repeat("k", 256) + `"`, CodeKeyInvalid},
		{`""`, CodeKeyMissing},
		{`sf-1"`, CodeKeyInvalid}, // not an sf-string: a bare key with a '"'
	} {
		_, err := c.Claim(ctx, tc.key, orderReq)
		var e *Error
		if !errors.Is(err, ErrInvalid) || !errors.As(err, &e) || e.Code != tc.code {
			t.Fatalf("key %q: %v, want %s", tc.key, err, tc.code)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	mustEqual(t, "requests sent for refused keys", len(f.calls)-len(calls), 0)
}

// sfString decodes as server/http_conv.c's http_sf_string does: the cases of
// tests/unit/test_http_conv.c ("" for why: valid; "-": not an sf-string).
func TestSfStringDecode(t *testing.T) {
	for _, tc := range []struct{ in, out, why string }{
		{`"order-1"`, "order-1", ""},
		{`""`, "", ""},
		{`  "a b"  `, "a b", ""},
		{`"say \"hi\" \\o/"`, `say "hi" \o/`, ""},
		{"\"~!#$%&'()*+,-./:;<=>?@[]^_`{|}\"", "~!#$%&'()*+,-./:;<=>?@[]^_`{|}", ""},
		{"order-1", "", "-"},
		{"", "", "-"},
		{"   ", "", "-"},
		{"'a'", "", "-"},
		{`a"b`, "", "-"},
		{`"abc`, "", "no closing"},
		{`"`, "", "no closing"},
		{`"abc\`, "", "no closing"},
		{`"abc\"`, "", "no closing"},
		{`"a\nb"`, "", "backslash"},
		{`"a\u0041"`, "", "backslash"},
		{"\"a\tb\"", "", "printable"},
		{"\"caf\xc3\xa9\"", "", "printable"},
		{"\"a\x7f\"", "", "printable"},
		{"\"a\x00b\"", "", "printable"},
		{`"abc";p=1`, "", "parameters"},
		{`"abc" x`, "", "follows"},
		{`"a""b"`, "", "follows"},
	} {
		out, isSF, why := sfString(tc.in)
		switch {
		case tc.why == "-" && (isSF || why != ""),
			tc.why == "" && (!isSF || why != "" || out != tc.out),
			tc.why != "-" && tc.why != "" && (!isSF || !strings.Contains(why, tc.why) || out != ""):
			t.Errorf("%q: %q %v %q, want %q %q", tc.in, out, isSF, why, tc.out, tc.why)
		}
	}
}

func TestErrorsByCode(t *testing.T) {
	cases := []struct {
		status int
		ctype  string
		body   string
		want   error
	}{
		{400, "application/json", `{"code":"idempotency_key_invalid","message":"m"}`, ErrInvalid},
		{401, "application/json", `{"code":"unauthenticated"}`, ErrUnauthorized},
		{403, "application/json", `{"code":"forbidden"}`, ErrForbidden},
		{409, "application/json", `{"code":"idempotency_request_in_progress"}`, ErrInProgress},
		{409, "application/json", `{"code":"idempotency_lease_expired"}`, ErrLeaseExpired},
		{409, "application/json", `{"code":"idempotency_outcome_unknown"}`, ErrUnknownOutcome},
		{410, "application/json", `{"code":"idempotency_key_expired"}`, ErrExpired},
		{413, "application/json", `{"code":"payload_too_large"}`, ErrTooLarge},
		{429, "application/json", `{"code":"idempotency_quota_exceeded"}`, ErrQuotaExceeded},
		{500, "application/json", `{"code":"internal"}`, ErrInternal},
		// RFC 9457 problem details, with extra members: the code still decides.
		{409, "application/problem+json; charset=utf-8",
			`{"type":"about:blank","title":"Conflict","status":409,"detail":"d","code":"idempotency_key_reused","request_id":"r1"}`,
			ErrMismatch},
		// A code this client does not know: its status decides.
		{429, "application/json", `{"code":"some_future_code"}`, ErrQuotaExceeded},
		{404, "text/html", `<html>`, ErrNotFound},
		{418, "text/plain", `teapot`, ErrProtocol},
	}
	for _, tc := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", tc.ctype)
			w.WriteHeader(tc.status)
			w.Write([]byte(tc.body))
		}))
		c, _ := New(Options{Nodes: []string{srv.URL}})
		_, err := c.Claim(context.Background(), "k", orderReq)
		srv.Close()
		var e *Error
		if !errors.Is(err, tc.want) || !errors.As(err, &e) || e.Status != tc.status {
			t.Fatalf("%d %s: got %v, want %v", tc.status, tc.body, err, tc.want)
		}
		for _, other := range []error{ErrMismatch, ErrUnavailable, ErrInvalid, ErrInProgress} {
			if other != tc.want && errors.Is(err, other) {
				t.Fatalf("%d %s: also %v", tc.status, tc.body, other)
			}
		}
	}
}

// The claim's answer is lost (the node applied it, then the connection dropped): the retry
// carries the same attempt id, and gets the same lease back (same token), not
// in_progress.
func TestClaimAfterLostAnswerReusesAttemptID(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if n != 0 {
			return false
		}
		rec := httptest.NewRecorder()
		r.Body = http.NoBody
		f.mu.Lock()
		f.claim(rec, r.Header.Get("Idempotency-Key"), body) // applied...
		f.mu.Unlock()
		drop(w) // ...and the answer lost
		return true
	})
	cl, err := c.Claim(context.Background(), "lost-1", orderReq)
	if err != nil || !cl.Acquired {
		t.Fatalf("claim: %+v, %v", cl, err)
	}
	calls := f.callsTo("/v1/claims")
	if len(calls) != 2 {
		t.Fatalf("%d claims, want 2", len(calls))
	}
	a0, a1 := attemptOf(t, calls[0].Body), attemptOf(t, calls[1].Body)
	if a0 == "" || a0 != a1 || a0 != cl.AttemptID {
		t.Fatalf("attempt ids %q, %q (claim's %q)", a0, a1, cl.AttemptID)
	}
	mustEqual(t, "token", cl.Token, f.record("lost-1").token)
}

// No answer within an attempt's time: the same claim again, same attempt id.
func TestClaimAfterAttemptTimeoutReusesAttemptID(t *testing.T) {
	f := newFake(t)
	c, _ := New(Options{Nodes: []string{f.srv.URL}, Token: f.token, AttemptTimeout: 100 * time.Millisecond,
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if n == 0 {
			time.Sleep(300 * time.Millisecond)
		}
		return false
	})
	cl, err := c.Claim(context.Background(), "slow-1", orderReq)
	if err != nil {
		t.Fatal(err)
	}
	calls := f.callsTo("/v1/claims")
	if len(calls) < 2 {
		t.Fatalf("%d claims, want a retry", len(calls))
	}
	for _, call := range calls {
		if a := attemptOf(t, call.Body); a != cl.AttemptID {
			t.Fatalf("attempt id %q, want %q", a, cl.AttemptID)
		}
	}
}

// A 503 moves the request to the next node, after its Retry-After at least.
func TestUnavailableMovesOnAfterRetryAfter(t *testing.T) {
	var hitsA int32
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&hitsA, 1)
		fakeErr(w, 503, CodeUnavailable, "no leader", 1)
	}))
	defer a.Close()
	f := newFake(t)
	c := f.client(t, a.URL, f.srv.URL)
	start := time.Now()
	cl, err := c.Claim(context.Background(), "k-503", orderReq)
	if err != nil || !cl.Acquired {
		t.Fatalf("claim: %v", err)
	}
	if el := time.Since(start); el < time.Second {
		t.Fatalf("retried after %v, before the 503's Retry-After (1 s)", el)
	}
	mustEqual(t, "hits on the node that answered 503", atomic.LoadInt32(&hitsA), 1)
	// The client stays on the node that answered.
	if _, err := c.Claim(context.Background(), "k-503b", orderReq); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "hits after", atomic.LoadInt32(&hitsA), 1)
}

// A node that refuses connections: the next one, at once.
func TestConnectionRefusedMovesOn(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	f := newFake(t)
	c := f.client(t, dead, f.srv.URL)
	start := time.Now()
	if _, err := c.Claim(context.Background(), "k-refused", orderReq); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Fatalf("took %v", el)
	}
	// Many calls moved the shared node index on: it keeps counting past the list's end,
	// and the calls still move from the dead node to the next.
	for i := uint32(2); i < 9; i++ {
		c.cur.Store(i)
		if _, err := c.Claim(context.Background(), fmt.Sprintf("k-refused-%d", i), orderReq); err != nil {
			t.Fatalf("from index %d: %v", i, err)
		}
	}
}

// Every node unavailable: retried with backoff until the deadline, then ErrUnavailable
// (wrapping the context's error); a Retry-After past the deadline ends it at once.
func TestUnavailableUntilDeadline(t *testing.T) {
	var hits int32
	retryAfter := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&hits, 1)
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(503) // not even idemd's body: a load balancer's
	}))
	defer srv.Close()
	c, _ := New(Options{Nodes: []string{srv.URL, srv.URL}, BackoffBase: 5 * time.Millisecond,
		BackoffMax: 40 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Claim(ctx, "k", orderReq)
	el := time.Since(start)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if el < 300*time.Millisecond || el > time.Second {
		t.Fatalf("gave up after %v", el)
	}
	// Backoff capped at 40 ms (20-40 ms each): at least 7 tries in 400 ms.
	if n := atomic.LoadInt32(&hits); n < 7 {
		t.Fatalf("%d tries", n)
	}
	retryAfter = "5"
	atomic.StoreInt32(&hits, 0)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	start = time.Now()
	_, err = c.Claim(ctx2, "k", orderReq)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrUnavailable) || e.RetryAfter != 5*time.Second {
		t.Fatalf("got %#v", err)
	}
	if time.Since(start) > 500*time.Millisecond || atomic.LoadInt32(&hits) != 1 {
		t.Fatalf("waited for a Retry-After beyond the deadline")
	}
}

func TestBackoffCappedWithJitter(t *testing.T) {
	c, _ := New(Options{Nodes: []string{"127.0.0.1:1"}, BackoffBase: 10 * time.Millisecond,
		BackoffMax: 200 * time.Millisecond})
	seen := map[time.Duration]bool{}
	for try := 0; try < 40; try++ {
		d := 10 * time.Millisecond << uint(try)
		if try > 5 || d > 200*time.Millisecond {
			d = 200 * time.Millisecond
		}
		b := c.backoff(try)
		if b < d/2 || b > d {
			t.Fatalf("try %d: %v outside [%v, %v]", try, b, d/2, d)
		}
		seen[b] = true
	}
	if len(seen) < 10 {
		t.Fatalf("no jitter: %v", seen)
	}
}

func TestTLS(t *testing.T) {
	f := newFake(t)
	srv := httptest.NewUnstartedServer(f)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted handshakes below
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	host := strings.TrimPrefix(srv.URL, "https://")
	c, err := New(Options{Nodes: []string{host}, Token: f.token, TLSConfig: &tls.Config{RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	if cl, err := c.Claim(context.Background(), "tls-1", orderReq); err != nil || !cl.Acquired {
		t.Fatalf("claim over TLS: %v", err)
	}
	// Without the CA, the server is not trusted: no answer, typed unavailable.
	c2, _ := New(Options{Nodes: []string{srv.URL}, Token: f.token, Timeout: 300 * time.Millisecond})
	if _, err := c2.Claim(context.Background(), "tls-2", orderReq); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("untrusted: %v", err)
	}
}

func TestNewChecksOptions(t *testing.T) {
	for _, o := range []Options{{}, {Nodes: []string{"ftp://h:1"}}, {Nodes: []string{"h"}},
		{Nodes: []string{"h:1"}, Token: "a\nb"}} {
		if _, err := New(o); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", o, err)
		}
	}
}

func TestFingerprintOf(t *testing.T) {
	a := FingerprintOf("post", "/a?y=2&x=1", []byte{0xff})
	b := FingerprintOf("POST", "/a?x=1&y=2", []byte{0xff})
	if a != b || len(a) != 64 {
		t.Fatalf("%s != %s", a, b)
	}
	if FingerprintOf("POST", "/a", []byte("x")) == FingerprintOf("POST", "/ax", nil) {
		t.Fatal("fields not framed")
	}
	mustEqual(t, "empty query", FingerprintOf("GET", "/a?", nil), FingerprintOf("GET", "/a", nil))
}

// A call whose own deadline passes while a node works on it leaves that node first in
// line: only the node's failures move the client on.
func TestDeadlineDoesNotMoveOn(t *testing.T) {
	f := newFake(t)
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		time.Sleep(200 * time.Millisecond)
		return false
	})
	c := f.client(t, f.srv.URL, f.srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Claim(ctx, "k-dl", orderReq); !errors.Is(err, ErrUnavailable) ||
		!errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	mustEqual(t, "node index", c.cur.Load(), 0)
}

func TestCheckPointers(t *testing.T) {
	ok := [][]string{nil, {}, {"/a", "/", "//", "/a~0b/c~1d", "/é", "/" + strings.Repeat("x", 255), "/0/-"},
		make([]string, 0, 40)}
	for i := 0; i < 32; i++ {
		ok[3] = append(ok[3], "/p")
	}
	for _, p := range ok {
		if err := CheckPointers("fingerprint_fields", p); err != nil {
			t.Fatalf("%q: %v", p, err)
		}
	}
	bad := []struct {
		ptrs   []string
		index  int
		reason string
	}{
		{append(ok[3], "/p"), -1, "33 pointers"},
		{[]string{""}, 0, `starts with "/"`},
		{[]string{"/a", "a/b"}, 1, `starts with "/"`},
		{[]string{"/" + strings.Repeat("x", 256)}, 0, "257 bytes"},
		{[]string{"/" + strings.Repeat("é", 128)}, 0, "257 bytes"},
		{[]string{"/a~"}, 0, `offset 2 is not "~0" or "~1"`},
		{[]string{"/a~2"}, 0, "offset 2"},
		{[]string{"/~01", "/x~~0"}, 1, "offset 2"},
		{[]string{"/\xff"}, 0, "not UTF-8"},
	}
	for _, b := range bad {
		err := CheckPointers("fingerprint_ignore", b.ptrs)
		var fe *FingerprintOptionError
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) || fe.Option != "fingerprint_ignore" ||
			fe.Index != b.index || !strings.Contains(err.Error(), b.reason) {
			t.Fatalf("%q: %v", b.ptrs, err)
		}
	}
}

// The options go in the claim's request object as they are; empty ones not at all; bad
// ones are refused before anything is sent.
func TestClaimFingerprintOptions(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	ctx := context.Background()
	req := Request{Method: "POST", Path: "/o", Body: map[string]int{"amount": 1, "ts": 2},
		FingerprintFields: []string{"/amount", "/meta/a~1b"}, FingerprintIgnore: []string{"/ts"}}
	if _, err := c.Claim(ctx, "fo-1", req); err != nil {
		t.Fatal(err)
	}
	req2 := req
	req2.FingerprintFields = []string{}
	req2.FingerprintIgnore = nil
	if _, err := c.Claim(ctx, "fo-2", req2); err != nil {
		t.Fatal(err)
	}
	calls := f.callsTo("/v1/claims")
	var got [2]map[string]json.RawMessage
	for i := range got {
		var b struct{ Request map[string]json.RawMessage }
		json.Unmarshal(calls[i].Body, &b)
		got[i] = b.Request
	}
	mustEqual(t, "fields", string(got[0]["fingerprint_fields"]), `["/amount","/meta/a~1b"]`)
	mustEqual(t, "ignore", string(got[0]["fingerprint_ignore"]), `["/ts"]`)
	mustEqual(t, "members without options", len(got[1]), 3)
	for _, bad := range []Request{
		{Method: "POST", Path: "/o", FingerprintIgnore: []string{"ts"}},
		{Method: "POST", Path: "/o", FingerprintFields: make([]string, 33)},
		{Fingerprint: strings.Repeat("ab", 32), FingerprintIgnore: []string{"/ts"}},
	} {
		if _, err := c.Claim(ctx, "fo-3", bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%+v: %v", bad, err)
		}
		ran := false
		_, err := c.Run(ctx, "fo-3", bad, func(ctx context.Context, token uint64) (*Response, error) {
			ran = true
			return &Response{Status: 200}, nil
		})
		if !errors.Is(err, ErrInvalid) || ran {
			t.Fatalf("Run %+v: %v", bad, err)
		}
	}
	var fe *FingerprintOptionError
	_, err := c.Claim(ctx, "fo-3", Request{Method: "POST", Path: "/o", FingerprintIgnore: []string{"/a~9"}})
	if !errors.As(err, &fe) || fe.Pointer != "/a~9" || fe.Index != 0 {
		t.Fatalf("%#v", err)
	}
	mustEqual(t, "claims sent", len(f.callsTo("/v1/claims")), 2)
}
