package idem

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// orderService: a handler that counts its runs and answers 201 with the body it read and
// its fencing token, unless the body asks for another status.
type orderService struct {
	runs    int32
	release chan struct{} // when set, each run waits for it
	tokens  []string
	mu      sync.Mutex
}

func (s *orderService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	atomic.AddInt32(&s.runs, 1)
	if s.release != nil {
		<-s.release
	}
	b, _ := io.ReadAll(r.Body)
	tok, ok := TokenFromContext(r.Context())
	s.mu.Lock()
	s.tokens = append(s.tokens, r.Header.Get("Idempotency-Fence"))
	s.mu.Unlock()
	if !ok || strconv.FormatUint(tok, 10) != r.Header.Get("Idempotency-Fence") {
		http.Error(w, "no token", 500)
		return
	}
	status := 201
	if strings.Contains(string(b), "status") {
		var v struct{ Status int }
		json.Unmarshal(b, &v)
		status = v.Status
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/1")
	w.Header().Set("X-Not-Stored", "first caller only")
	if strings.Contains(string(b), "binary") {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(status)
		w.Write([]byte{0xff, 0x00, 0xfe})
		return
	}
	w.WriteHeader(status)
	w.Write([]byte(`{"order":` + string(b) + `}`))
}

func send(t *testing.T, url, method, key, ctype, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(resp *http.Response) string {
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(b)
}

func codeOf(t *testing.T, resp *http.Response) string {
	t.Helper()
	var e struct{ Code string }
	if err := json.Unmarshal([]byte(readAll(resp)), &e); err != nil {
		t.Fatalf("not a JSON error: %v", err)
	}
	return e.Code
}

func newService(t *testing.T, c *Client, routes ...Route) (*orderService, *httptest.Server) {
	svc := &orderService{}
	srv := httptest.NewServer(Middleware(c, routes...)(svc))
	t.Cleanup(srv.Close)
	return svc, srv
}

func TestMiddlewareOnceAndReplay(t *testing.T) {
	f := newFake(t)
	svc, srv := newService(t, f.client(t), Route{PathPrefix: "/orders"})
	const js = "application/json"
	first := send(t, srv.URL+"/orders?x=1", "POST", "mw-1", js, `{"amount":10,"currency":"EUR"}`)
	fb := readAll(first)
	if first.StatusCode != 201 || first.Header.Get("X-Not-Stored") == "" ||
		first.Header.Get("Idempotency-Replayed") != "" || first.Header.Get("Idempotency-Recorded") != "" {
		t.Fatalf("first: %d %v", first.StatusCode, first.Header)
	}
	// The same request, its JSON keys in another order: the replay.
	second := send(t, srv.URL+"/orders?x=1", "POST", "mw-1", js, `{"currency":"EUR", "amount":10}`)
	sb := readAll(second)
	if second.StatusCode != 201 || sb != fb || second.Header.Get("Idempotency-Replayed") != "true" ||
		second.Header.Get("Location") != "/orders/1" || second.Header.Get("Content-Type") != js ||
		second.Header.Get("X-Not-Stored") != "" {
		t.Fatalf("second: %d %v %q", second.StatusCode, second.Header, sb)
	}
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 1)
	// Another body under the same key: 409, the handler does not run.
	third := send(t, srv.URL+"/orders?x=1", "POST", "mw-1", js, `{"amount":99,"currency":"EUR"}`)
	if third.StatusCode != 409 || codeOf(t, third) != CodeMismatch {
		t.Fatalf("changed body: %d", third.StatusCode)
	}
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 1)
	// The claim named the request for the gateway to fingerprint: method, path with its
	// query, and the JSON body as a JSON value.
	var cb claimBody
	json.Unmarshal(f.callsTo("/v1/claims")[0].Body, &cb)
	if cb.Request == nil || cb.Request.Method != "POST" || cb.Request.Path != "/orders?x=1" ||
		string(cb.Request.Body) != `{"amount":10,"currency":"EUR"}` || cb.AttemptID == "" {
		t.Fatalf("claim: %+v", cb)
	}
}

// A replay carries the stored answer's headers, not the Idempotency-Attempt the gateway adds
// to every claim's answer (the replaying claim's own attempt).
func TestMiddlewareReplayLeavesTheAttemptOut(t *testing.T) {
	f := newFake(t)
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if r.URL.Path == "/v1/claims" { // as the gateway answers every claim
			w.Header().Set("Idempotency-Attempt", attemptOf(t, body))
		}
		return false
	})
	_, srv := newService(t, f.client(t), Route{PathPrefix: "/orders"})
	const js = "application/json"
	first := send(t, srv.URL+"/orders", "POST", "mw-att", js, `{"amount":10}`)
	readAll(first)
	second := send(t, srv.URL+"/orders", "POST", "mw-att", js, `{"amount":10}`)
	readAll(second)
	if second.Header.Get("Idempotency-Replayed") != "true" || second.Header.Get("Idempotency-Attempt") != "" {
		t.Fatalf("replay: %d %v", second.StatusCode, second.Header)
	}
}

// A caller that hangs up while its claim is on its way: the claim that committed is
// released (the handler did not run), not left held until its lease ends.
func TestMiddlewareReleasesAClaimItsCallerLeft(t *testing.T) {
	f := newFake(t)
	claimed := make(chan struct{})
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if r.URL.Path == "/v1/claims" {
			<-claimed // the caller has gone; the claim commits and answers now
		}
		return false
	})
	c := f.client(t)
	ran := int32(0)
	h := Middleware(c, Route{PathPrefix: "/o"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&ran, 1)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("POST", "/o", strings.NewReader("b")).WithContext(ctx)
	req.Header.Set("Idempotency-Key", "mw-left")
	done := make(chan struct{})
	go func() {
		h.ServeHTTP(httptest.NewRecorder(), req)
		close(done)
	}()
	time.Sleep(100 * time.Millisecond)
	cancel() // the caller hangs up
	time.Sleep(50 * time.Millisecond)
	close(claimed)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the middleware did not return")
	}
	mustEqual(t, "runs", atomic.LoadInt32(&ran), 0)
	if rel := f.callsTo("/v1/claims/release"); len(rel) != 1 {
		t.Fatalf("releases: %d", len(rel))
	}
	if rec := f.record("mw-left"); rec == nil || rec.state != "released" {
		t.Fatalf("record: %+v", rec)
	}
}

func TestMiddlewareRoutesAndKeys(t *testing.T) {
	f := newFake(t)
	svc, srv := newService(t, f.client(t), Route{PathPrefix: "/orders"},
		Route{Method: "PUT", PathPrefix: "/strict/", KeyRequired: true, MismatchStatus: 422})
	// Not a route: /orderly, GET /orders, POST /strict: passed through, nothing claimed.
	for _, c := range []struct{ method, path string }{{"POST", "/orderly"}, {"GET", "/orders"},
		{"POST", "/strict/x"}} {
		resp := send(t, srv.URL+c.path, c.method, "k-pass", "", "a")
		readAll(resp)
		if resp.StatusCode != 500 { // the service wants a token: it ran unclaimed
			t.Fatalf("%s %s: %d", c.method, c.path, resp.StatusCode)
		}
	}
	// No key: passed through, unless the route requires one.
	resp := send(t, srv.URL+"/orders/7", "POST", "", "", "a")
	readAll(resp)
	mustEqual(t, "no key", resp.StatusCode, 500)
	resp = send(t, srv.URL+"/strict/7", "PUT", "", "", "a")
	if resp.StatusCode != 400 || codeOf(t, resp) != CodeKeyMissing {
		t.Fatalf("required key: %d", resp.StatusCode)
	}
	mustEqual(t, "claims", len(f.callsTo("/v1/claims")), 0)
	// A bad key: 400 as the gateway says.
	resp = send(t, srv.URL+"/orders/7", "POST", "bad key", "", "a")
	if resp.StatusCode != 400 || codeOf(t, resp) != CodeKeyInvalid {
		t.Fatalf("bad key: %d", resp.StatusCode)
	}
	// The route's mismatch status.
	readAll(send(t, srv.URL+"/strict/7", "PUT", "k-s", "", "one"))
	resp = send(t, srv.URL+"/strict/7", "PUT", "k-s", "", "two")
	if resp.StatusCode != 422 || codeOf(t, resp) != CodeMismatch {
		t.Fatalf("mismatch status: %d", resp.StatusCode)
	}
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 5)
}

// An Idempotency-Key sent as an RFC 8941 sf-string is the key between its quotes, as the
// gateway and proxy mode take it: the bare key's retry gets its replay. A bad sf-string is
// refused (400 idempotency_key_invalid) before idemd is asked.
func TestMiddlewareSfStringKey(t *testing.T) {
	f := newFake(t)
	svc, srv := newService(t, f.client(t), Route{PathPrefix: "/orders"})
	first := send(t, srv.URL+"/orders", "POST", `"mw-sf"`, "", "x")
	readAll(first)
	mustEqual(t, "first", first.StatusCode, 201)
	if rec := f.record("mw-sf"); rec == nil || rec.state != "completed" {
		t.Fatalf("record of the bare key: %+v", rec)
	}
	second := send(t, srv.URL+"/orders", "POST", "mw-sf", "", "x")
	readAll(second)
	if second.StatusCode != 201 || second.Header.Get("Idempotency-Replayed") != "true" {
		t.Fatalf("bare retry: %d %v", second.StatusCode, second.Header)
	}
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 1)
	checkProblem(t, "bad sf-string", send(t, srv.URL+"/orders", "POST", `"`+secretKey, "", "x"),
		400, CodeKeyInvalid, "", "")
	mustEqual(t, "claims", len(f.callsTo("/v1/claims")), 2)
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 1)
}

func TestMiddlewareInProgress(t *testing.T) {
	f := newFake(t)
	svc, srv := newService(t, f.client(t), Route{PathPrefix: "/", Lease: 5 * time.Second})
	svc.release = make(chan struct{})
	done := make(chan *http.Response)
	go func() { done <- send(t, srv.URL+"/o", "POST", "mw-ip", "", "x") }()
	for atomic.LoadInt32(&svc.runs) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	resp := send(t, srv.URL+"/o", "POST", "mw-ip", "", "x")
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != 409 || codeOf(t, resp) != CodeInProgress || ra < 1 || ra > 5 {
		t.Fatalf("in progress: %d %v", resp.StatusCode, resp.Header)
	}
	close(svc.release)
	first := <-done
	readAll(first)
	mustEqual(t, "first", first.StatusCode, 201)
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 1)
}

// idemd unreachable: 503 with Retry-After, and the handler never runs (fail closed).
func TestMiddlewareFailsClosed(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String()
	l.Close()
	c, _ := New(Options{Nodes: []string{dead}, Timeout: 200 * time.Millisecond})
	svc, srv := newService(t, c, Route{})
	resp := send(t, srv.URL+"/o", "POST", "mw-down", "", "x")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || codeOf(t, resp) != CodeUnavailable {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 0)
}

func TestMiddlewareOutcomes(t *testing.T) {
	f := newFake(t)
	svc, srv := newService(t, f.client(t), Route{})
	// A 4xx is released: the next try runs again.
	readAll(send(t, srv.URL+"/o", "POST", "mw-4", "application/json", `{"status":400}`))
	resp := send(t, srv.URL+"/o", "POST", "mw-4", "application/json", `{"status":400}`)
	readAll(resp)
	if resp.StatusCode != 400 || resp.Header.Get("Idempotency-Replayed") != "" {
		t.Fatalf("4xx: %d %v", resp.StatusCode, resp.Header)
	}
	mustEqual(t, "runs after two 4xx", atomic.LoadInt32(&svc.runs), 2)
	// A 5xx is stored (failed_final) and replayed.
	readAll(send(t, srv.URL+"/o", "POST", "mw-5", "application/json", `{"status":503}`))
	resp = send(t, srv.URL+"/o", "POST", "mw-5", "application/json", `{"status":503}`)
	readAll(resp)
	if resp.StatusCode != 503 || resp.Header.Get("Idempotency-Replayed") != "true" {
		t.Fatalf("5xx: %d %v", resp.StatusCode, resp.Header)
	}
	mustEqual(t, "5xx record", f.record("mw-5").completion, FailedFinal)
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 3)
	// An answer that cannot be stored inline: recorded by its digest, passed on marked.
	first := send(t, srv.URL+"/o", "POST", "mw-bin", "", "binary")
	if b := readAll(first); first.StatusCode != 201 || b != "\xff\x00\xfe" ||
		first.Header.Get("Idempotency-Recorded") != "false" {
		t.Fatalf("binary: %d %v %q", first.StatusCode, first.Header, b)
	}
	resp = send(t, srv.URL+"/o", "POST", "mw-bin", "", "binary")
	if resp.StatusCode != 502 || codeOf(t, resp) != CodeResponseTooLarge {
		t.Fatalf("binary replay: %d", resp.StatusCode)
	}
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 4)
	// A request body that is not UTF-8 is fingerprinted on this side.
	readAll(send(t, srv.URL+"/o", "POST", "mw-raw", "", "\xff\xfe"))
	var cb claimBody
	calls := f.callsTo("/v1/claims")
	json.Unmarshal(calls[len(calls)-1].Body, &cb)
	mustEqual(t, "fingerprint", cb.Fingerprint, FingerprintOf("POST", "/o", []byte("\xff\xfe")))
}

// The recording fails (every complete answers 503 until the finish deadline): the caller
// gets the handler's answer, marked as not recorded.
func TestMiddlewareUnrecorded(t *testing.T) {
	f := newFake(t)
	c, _ := New(Options{Nodes: []string{f.srv.URL}, Token: f.token, FinishTimeout: 300 * time.Millisecond,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
		if r.URL.Path == "/v1/claims/complete" {
			fakeErr(w, 503, CodeUnavailable, "no quorum", 0)
			return true
		}
		return false
	})
	_, srv := newService(t, c, Route{})
	resp := send(t, srv.URL+"/o", "POST", "mw-unrec", "", "x")
	readAll(resp)
	if resp.StatusCode != 201 || resp.Header.Get("Idempotency-Recorded") != "false" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
}

func TestMiddlewareContextToken(t *testing.T) {
	f := newFake(t)
	svc, srv := newService(t, f.client(t), Route{})
	readAll(send(t, srv.URL+"/o", "POST", "mw-tok", "", "x"))
	want := strconv.FormatUint(f.record("mw-tok").token, 10)
	mustEqual(t, "fence", svc.tokens, []string{want})
	if _, ok := TokenFromContext(context.Background()); ok {
		t.Fatal("token outside a claim")
	}
}

// A caller's own Idempotency-Fence never reaches the handler, as proxy mode forwards none:
// not on a request that passes through (no route, no key) and not on a claimed one, which
// gets the claim's token instead. The Idempotency-Key a caller sent is left as it is.
func TestMiddlewareDropsACallersFence(t *testing.T) {
	f := newFake(t)
	type seen struct{ fences, keys []string }
	var mu sync.Mutex
	var got []seen
	h := Middleware(f.client(t), Route{PathPrefix: "/orders"})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, seen{r.Header.Values("Idempotency-Fence"), r.Header.Values("Idempotency-Key")})
			mu.Unlock()
			w.WriteHeader(201)
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, c := range []struct{ method, path, key string }{
		{"GET", "/orders", "mw-f1"},  // no route
		{"POST", "/other", ""},       // no route, no key
		{"POST", "/orders", ""},      // a route, no key
		{"POST", "/orders", "mw-f2"}, // claimed
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader("x"))
		req.Header.Add("Idempotency-Fence", "999999999")
		req.Header.Add("Idempotency-Fence", "1")
		if c.key != "" {
			req.Header.Set("Idempotency-Key", c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(resp)
		mustEqual(t, c.method+" "+c.path, resp.StatusCode, 201)
	}
	mu.Lock()
	defer mu.Unlock()
	token := strconv.FormatUint(f.record("mw-f2").token, 10)
	want := []seen{{nil, []string{"mw-f1"}}, {nil, nil}, {nil, nil},
		{[]string{token}, []string{"mw-f2"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the handler saw %q, want %q", got, want)
	}
}

// ---- refusals as problem details, fingerprint options ------------------------------------

// secretKey must never appear in a refusal's body.
const secretKey = "secret-key-4f2a9c"

// checkProblem: resp is RFC 9457 problem details as the gateway writes its errors: the
// content type, every member and only those (request_id and instance with rid only).
func checkProblem(t *testing.T, what string, resp *http.Response, status int, code, rid, retryAfter string) problem {
	t.Helper()
	raw := readAll(resp)
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/problem+json" ||
		resp.Header.Get("Retry-After") != retryAfter {
		t.Fatalf("%s: %d %v %s", what, resp.StatusCode, resp.Header, raw)
	}
	if strings.Contains(raw, secretKey) {
		t.Fatalf("%s: the key is in the body: %s", what, raw)
	}
	var members map[string]interface{}
	var p problem
	if json.Unmarshal([]byte(raw), &members) != nil || json.Unmarshal([]byte(raw), &p) != nil {
		t.Fatalf("%s: not JSON: %s", what, raw)
	}
	want := []string{"code", "detail", "message", "status", "title", "type"}
	if rid != "" {
		want = append(want, "instance", "request_id")
	}
	if len(members) != len(want) {
		t.Fatalf("%s: members %v, want %v", what, members, want)
	}
	for _, m := range want {
		if _, ok := members[m]; !ok {
			t.Fatalf("%s: no %s in %s", what, m, raw)
		}
	}
	if p.Type != "urn:idemd:problem:"+code || p.Code != code || p.Status != status ||
		p.Title != problemTitles[code] || p.Title == "" || p.Detail == "" || p.Message != p.Detail {
		t.Fatalf("%s: %+v", what, p)
	}
	if rid != "" && (p.RequestID != rid || p.Instance != "urn:idemd:request:"+rid) {
		t.Fatalf("%s: request id %+v, want %s", what, p, rid)
	}
	return p
}

func sendKeys(t *testing.T, url string, keys []string, ctype, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if keys != nil {
		req.Header["Idempotency-Key"] = keys
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// The titles are the gateway's own (server/http_conv.c).
func TestProblemTitlesAreTheGateways(t *testing.T) {
	src, err := os.ReadFile("../../server/http_conv.c")
	if err != nil {
		t.Skip("no server/http_conv.c:", err)
	}
	s := string(src)
	s = s[strings.Index(s, "http_problem_title("):]
	s = s[:strings.Index(s, "};")]
	got := map[string]string{}
	for _, m := range regexp.MustCompile(`\{"([a-z_]+)", "([^"]*)"\}`).FindAllStringSubmatch(s, -1) {
		got[m[1]] = m[2]
	}
	if len(got) < 20 || !reflect.DeepEqual(got, problemTitles) {
		t.Fatalf("gateway's %v\nmiddleware's %v", got, problemTitles)
	}
}

// Every answer of idemd that refuses the claim comes to a problem details refusal, with
// the request id of idemd's answer; the handler never runs.
func TestMiddlewareRefusalsAsProblems(t *testing.T) {
	cases := []struct {
		what       string
		status     int // idemd's answer to the claim (0: 200 that is not JSON)
		code       string
		ra         int
		route      Route
		wantStatus int
		wantCode   string
		rid        string
		wantRA     string
	}{
		{"reused", 409, CodeMismatch, 0, Route{}, 409, CodeMismatch, "fake0001", ""},
		{"reused 422", 409, CodeMismatch, 0, Route{MismatchStatus: 422}, 422, CodeMismatch, "fake0001", ""},
		{"in progress", 409, CodeInProgress, 5, Route{}, 409, CodeInProgress, "fake0001", "5"},
		{"in progress 425", 409, CodeInProgress, 0, Route{InProgressStatus: 425}, 425, CodeInProgress, "fake0001", "1"},
		{"lease expired", 409, CodeLeaseExpired, 0, Route{}, 409, CodeLeaseExpired, "fake0001", ""},
		{"quarantined", 409, CodeOutcomeUnknown, 0, Route{}, 409, CodeOutcomeUnknown, "fake0001", ""},
		{"expired", 410, CodeKeyExpired, 0, Route{}, 410, CodeKeyExpired, "fake0001", ""},
		{"quota", 429, CodeQuotaExceeded, 0, Route{}, 429, CodeQuotaExceeded, "fake0001", ""},
		{"bad key", 400, CodeKeyInvalid, 0, Route{}, 400, CodeKeyInvalid, "fake0001", ""},
		{"bad request", 400, CodeInvalidRequest, 0, Route{}, 400, CodeInvalidRequest, "fake0001", ""},
		{"claim too large", 413, CodePayloadTooLarge, 0, Route{}, 413, CodePayloadTooLarge, "fake0001", ""},
		{"digest only", 502, CodeResponseTooLarge, 0, Route{}, 502, CodeResponseTooLarge, "fake0001", ""},
		{"token refused", 401, CodeUnauthenticated, 0, Route{}, 500, CodeInternal, "fake0001", ""},
		{"admin token", 403, CodeForbidden, 0, Route{}, 500, CodeInternal, "fake0001", ""},
		{"node fault", 500, CodeInternal, 0, Route{}, 500, CodeInternal, "fake0001", ""},
		{"no quorum", 503, CodeUnavailable, 1, Route{}, 503, CodeUnavailable, "fake0001", "1"},
		{"unreadable", 0, "", 0, Route{}, 500, CodeInternal, "", ""},
	}
	for _, tc := range cases {
		f := newFake(t)
		f.setHook(func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool {
			if tc.status == 0 {
				io.WriteString(w, "garbage")
			} else {
				fakeErr(w, tc.status, tc.code, "m", tc.ra)
			}
			return true
		})
		c, _ := New(Options{Nodes: []string{f.srv.URL}, Token: f.token, Timeout: 300 * time.Millisecond,
			BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
		tc.route.PathPrefix = "/o"
		svc, srv := newService(t, c, tc.route)
		resp := send(t, srv.URL+"/o", "POST", secretKey, "application/json", `{"a":1}`)
		p := checkProblem(t, tc.what, resp, tc.wantStatus, tc.wantCode, tc.rid, tc.wantRA)
		if tc.code == CodeMismatch && p.Detail != "the key was used with a different request" {
			t.Fatalf("%s: detail %q", tc.what, p.Detail)
		}
		mustEqual(t, tc.what+": runs", atomic.LoadInt32(&svc.runs), 0)
		c.Close()
	}
}

// Refusals made before idemd is asked (or when no node answers): no request id.
func TestMiddlewareLocalRefusalsAsProblems(t *testing.T) {
	f := newFake(t)
	svc, srv := newService(t, f.client(t), Route{PathPrefix: "/o", KeyRequired: true})
	url := srv.URL + "/o"
	checkProblem(t, "no key", sendKeys(t, url, nil, "", "x"), 400, CodeKeyMissing, "", "")
	checkProblem(t, "empty key", sendKeys(t, url, []string{""}, "", "x"), 400, CodeKeyMissing, "", "")
	checkProblem(t, "key twice", sendKeys(t, url, []string{secretKey, secretKey}, "", "x"), 400, CodeKeyInvalid, "", "")
	checkProblem(t, "bad key", sendKeys(t, url, []string{secretKey + "/x"}, "", "x"), 400, CodeKeyInvalid, "", "")
	checkProblem(t, "too large", sendKeys(t, url, []string{secretKey}, "", strings.Repeat("x", maxRequestBody+1)),
		413, CodePayloadTooLarge, "", "")
	checkProblem(t, "not JSON", sendKeys(t, url, []string{secretKey}, "application/json", `{"a":`), 400,
		CodeInvalidRequest, "", "")
	mustEqual(t, "claims", len(f.callsTo("/v1/claims")), 0)
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 0)

	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String()
	l.Close()
	c, _ := New(Options{Nodes: []string{dead}, Timeout: 200 * time.Millisecond})
	_, srv = newService(t, c, Route{})
	checkProblem(t, "no node", send(t, srv.URL+"/o", "POST", secretKey, "", "x"), 503, CodeUnavailable, "", "1")
}

func TestMiddlewareFingerprintOptions(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	if _, err := NewMiddleware(c, Route{}, Route{FingerprintIgnore: []string{"ts"}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a bad pointer: %v", err)
	} else if fe := (*FingerprintOptionError)(nil); !errors.As(err, &fe) || fe.Option != "fingerprint_ignore" || fe.Index != 0 {
		t.Fatalf("a bad pointer: %#v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Middleware took a bad pointer")
			}
		}()
		Middleware(c, Route{FingerprintFields: make([]string, 33)})
	}()
	svc, srv := newService(t, c, Route{PathPrefix: "/a", FingerprintIgnore: []string{"/ts", "/meta/trace~1id"}},
		Route{PathPrefix: "/b", FingerprintFields: []string{"/amount"}})
	const js = "application/json"
	// Passed through in the claim's request object, with a JSON body only.
	readAll(send(t, srv.URL+"/a", "POST", "fo-1", js, `{"amount":1,"ts":1,"meta":{"trace/id":"x"}}`))
	readAll(send(t, srv.URL+"/a", "POST", "fo-2", "text/plain", `ts=1`))
	calls := f.callsTo("/v1/claims")
	var first, second map[string]map[string]interface{}
	json.Unmarshal(calls[0].Body, &first)
	json.Unmarshal(calls[1].Body, &second)
	mustEqual(t, "options", first["request"]["fingerprint_ignore"], []interface{}{"/ts", "/meta/trace~1id"})
	if _, ok := first["request"]["fingerprint_fields"]; ok {
		t.Fatalf("an empty option sent: %v", first)
	}
	if len(second["request"]) != 3 {
		t.Fatalf("options with a text body: %v", second)
	}
	// As the (fake) gateway applies them: an ignored value changed replays, another one
	// changed is the reused-key refusal.
	r := send(t, srv.URL+"/a", "POST", "fo-1", js, `{"amount":1,"ts":2,"meta":{"trace/id":"y"}}`)
	readAll(r)
	mustEqual(t, "ignored changed", r.Header.Get("Idempotency-Replayed"), "true")
	r = send(t, srv.URL+"/a", "POST", "fo-1", js, `{"amount":2,"ts":2}`)
	checkProblem(t, "hashed changed", r, 409, CodeMismatch, "fake0001", "")
	readAll(send(t, srv.URL+"/b", "POST", "fo-3", js, `{"amount":5,"note":"a"}`))
	r = send(t, srv.URL+"/b", "POST", "fo-3", js, `{"note":"b","amount":5}`)
	readAll(r)
	mustEqual(t, "unselected changed", r.Header.Get("Idempotency-Replayed"), "true")
	checkProblem(t, "selected changed", send(t, srv.URL+"/b", "POST", "fo-3", js, `{"amount":6,"note":"a"}`),
		409, CodeMismatch, "fake0001", "")
	mustEqual(t, "runs", atomic.LoadInt32(&svc.runs), 3)
}
