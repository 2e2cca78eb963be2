package idem

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
