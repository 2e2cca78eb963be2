//go:build integration

package idem

// Tests against a real three-node cluster, run by tests/integration/test_go_client.py
// (ctest integration.goclient), which starts the cluster, builds this file into a test
// binary (go test -c -tags integration) and runs it with -test.run Integration and:
//
//	IDEM_GO_NODES  the nodes' gateways, "http://127.0.0.1:P1,...", the leader first
//	IDEM_GO_TOKEN  the bearer token of a tenant (lease_policy conflict, lease 30 s)
//
// TestServerFingerprintOptions (not matched by -test.run Integration) needs a gateway that
// applies the fingerprint options; test_go_client.py's TestGoFingerprintOptions runs it.
//
// TestServerTLS (not matched either) needs a cluster whose gateways serve HTTPS and require
// a client certificate (tls.http, tls.http_client_certs: require); test_go_client.py's
// TestGoTls runs it with IDEM_GO_NODES "https://127.0.0.1:P1,..." and IDEM_GO_PKI, the
// directory of test_tls_bench.make_pki's files (ca.crt, client.crt, client.key,
// other-ca.crt: a CA that signed nothing there).
//
// TestIntegrationLeaderKill asks the driver to kill the leader: it prints the line
// IDEM-KILL-LEADER on stdout from inside the function Run runs, and waits for the driver's
// answer (one line on stdin) before the function returns, so the kill falls inside the run.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func itClient(t *testing.T) *Client {
	nodes := os.Getenv("IDEM_GO_NODES")
	if nodes == "" {
		t.Fatal("IDEM_GO_NODES is not set: run me through tests/integration/test_go_client.py")
	}
	c, err := New(Options{Nodes: strings.Split(nodes, ","), Token: os.Getenv("IDEM_GO_TOKEN")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// itKey: a key of this run's own.
func itKey(name string) string { return "go-it-" + name + "-" + NewAttemptID()[:12] }

// runMany calls Run on one key from n goroutines at once; returns their results and errors.
func runMany(c *Client, n int, key string, req Request, timeout time.Duration, entered *int32,
	fn RunFunc) ([]*Result, []error) {
	results, errs := make([]*Result, n), make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			atomic.AddInt32(entered, 1)
			results[i], errs[i] = c.Run(ctx, key, req, fn)
		}(i)
	}
	close(start)
	wg.Wait()
	return results, errs
}

// (1) 32 goroutines on one key: the function runs exactly once, and every caller gets its
// response: one as the run, 31 replayed.
func TestIntegrationConcurrentRun(t *testing.T) {
	c := itClient(t)
	key := itKey("concurrent")
	var calls, entered int32
	fn := func(ctx context.Context, token uint64) (*Response, error) {
		atomic.AddInt32(&calls, 1)
		time.Sleep(300 * time.Millisecond) // the others meet it in progress
		return &Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(fmt.Sprintf(`{"charged":10,"fence":%d}`, token))}, nil
	}
	req := Request{Method: "POST", Path: "/charges", Body: map[string]int{"amount": 10}}
	results, errs := runMany(c, 32, key, req, 20*time.Second, &entered, fn)
	if calls != 1 {
		t.Fatalf("fn ran %d times", calls)
	}
	var ran, replayed int
	var body string
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if body == "" {
			body = string(res.Response.Body)
		}
		if string(res.Response.Body) != body || res.Response.Status != 201 {
			t.Fatalf("caller %d got %d %q, another %q", i, res.Response.Status, res.Response.Body, body)
		}
		if res.Ran {
			ran++
		}
		if res.Replayed {
			replayed++
			if res.Response.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("replayed headers %v", res.Response.Header)
			}
		}
	}
	if ran != 1 || replayed != 31 {
		t.Fatalf("ran %d, replayed %d", ran, replayed)
	}
}

// (3) A 2 s lease through a 5 s function: the renewals keep it, so another attempt finds
// the key in progress at 3 s and at 4.5 s (past the claim's own lease), where the same
// lease without renewals has lapsed (the control key: lease_expired, the tenant's
// policy being conflict).
func TestIntegrationRenewal(t *testing.T) {
	c := itClient(t)
	key, control := itKey("renew"), itKey("renew-control")
	req := Request{Method: "POST", Path: "/slow", Lease: 2 * time.Second}
	ctx := context.Background()
	if _, err := c.Claim(ctx, control, req); err != nil {
		t.Fatal(err)
	}
	var calls int32
	var during []error
	fn := func(ctx context.Context, token uint64) (*Response, error) {
		atomic.AddInt32(&calls, 1)
		start := time.Now()
		for _, at := range []time.Duration{3 * time.Second, 4500 * time.Millisecond} {
			time.Sleep(time.Until(start.Add(at)))
			_, err := c.Claim(ctx, key, req) // a fresh attempt id: another attempt
			during = append(during, err)
		}
		time.Sleep(time.Until(start.Add(5 * time.Second)))
		return &Response{Status: 200, Body: []byte("slow and once")}, nil
	}
	res, err := c.Run(ctx, key, req, fn)
	if err != nil || !res.Ran || res.LeaseLapsed {
		t.Fatalf("run: %+v, %v", res, err)
	}
	for i, e := range during {
		if !errors.Is(e, ErrInProgress) {
			t.Fatalf("claim %d during the run: %v, want in progress", i, e)
		}
	}
	// A renewal every third of 2 s, over 5 s: about seven.
	if res.Renewals < 5 {
		t.Fatalf("%d renewals", res.Renewals)
	}
	if _, err := c.Claim(ctx, control, Request{Method: "POST", Path: "/slow"}); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("control key (no renewals): %v, want lease expired", err)
	}
	rec, err := c.Get(ctx, key)
	if err != nil || rec.State != "completed" || string(rec.Response.Body) != "slow and once" {
		t.Fatalf("record: %+v, %v", rec, err)
	}
	if calls != 1 {
		t.Fatalf("fn ran %d times", calls)
	}
}

// (4) The middleware over an httptest server: the same key twice runs the handler once
// and replays its answer; a changed body under that key is refused with 409.
func TestIntegrationMiddleware(t *testing.T) {
	c := itClient(t)
	var runs int32
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := atomic.AddInt32(&runs, 1)
		b, _ := io.ReadAll(r.Body)
		fence, _ := TokenFromContext(r.Context())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"fence":%d,"request":%s}`, n, fence, b)
	})
	srv := httptest.NewServer(Middleware(c, Route{PathPrefix: "/orders"})(orders))
	defer srv.Close()
	key := itKey("mw")
	post := func(body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	r1, b1 := post(`{"amount": 10, "currency": "EUR"}`)
	if r1.StatusCode != 201 || r1.Header.Get("Idempotency-Replayed") != "" {
		t.Fatalf("first: %d %v %s", r1.StatusCode, r1.Header, b1)
	}
	// The same request (its keys in another order: the gateway's canonical JSON).
	r2, b2 := post(`{"currency": "EUR", "amount": 10}`)
	if r2.StatusCode != 201 || b2 != b1 || r2.Header.Get("Idempotency-Replayed") != "true" ||
		r2.Header.Get("Location") != "/orders/1" {
		t.Fatalf("second: %d %v %s (first %s)", r2.StatusCode, r2.Header, b2, b1)
	}
	r3, b3 := post(`{"amount": 99, "currency": "EUR"}`)
	checkGatewayProblem(t, "changed body", r3, b3, 409, CodeMismatch, key)
	if runs != 1 {
		t.Fatalf("the handler ran %d times", runs)
	}
}

// checkGatewayProblem: a middleware's refusal of a claim the cluster refused: problem
// details with every member the gateway writes, the request id of the gateway's answer (16
// hex digits: the gateway made it, as this client sends none) in request_id and instance,
// and not the key.
func checkGatewayProblem(t *testing.T, what string, resp *http.Response, body string, status int, code, key string) {
	t.Helper()
	var p map[string]interface{}
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal([]byte(body), &p) != nil || len(p) != 8 {
		t.Fatalf("%s: %d %v %s", what, resp.StatusCode, resp.Header, body)
	}
	rid, _ := p["request_id"].(string)
	if p["type"] != "urn:idemd:problem:"+code || p["code"] != code || p["status"] != float64(status) ||
		p["title"] != problemTitles[code] || p["detail"] == "" || p["message"] != p["detail"] ||
		!regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(rid) || p["instance"] != "urn:idemd:request:"+rid {
		t.Fatalf("%s: %s", what, body)
	}
	if strings.Contains(body, key) {
		t.Fatalf("%s: the key in the body: %s", what, body)
	}
}

// (2) 32 goroutines inside Run on one key while the leader is killed (SIGKILL), the
// function inside its run: it prints IDEM-KILL-LEADER once all 32 callers are inside Run,
// and returns only after the driver answered that it killed the leader (and 1 s after it
// began at the least).
//
// What must hold, and why:
//   - fn ran exactly once. At most once: the claim that acquired the key was committed on
//     a majority before it was answered, so the new leader holds the key as processing
//     under that holder (lease 30 s, renewed; policy conflict): no other caller's claim can
//     acquire it, before or after the kill. At least once: the driver's answer came from
//     inside fn.
//   - every caller ends with fn's response: the runner as the run, the 31 others replayed.
//     None may end with an error, not even a typed "not known" one (ErrUnavailable): the
//     cluster elects a new leader in about a second, well inside each caller's deadline,
//     so a caller that gave up did so early (as python_failover requires of the Python
//     client).
//   - the key ends completed with fn's response: with two of three nodes alive a quorum
//     remains, and the runner retries its complete (same token, same outcome: idempotent)
//     for 15 s, well past an election; a later Run replays that response without running.
func TestIntegrationLeaderKill(t *testing.T) {
	c := itClient(t)
	key := itKey("kill")
	const n = 32
	var calls, entered int32
	answer := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		answer <- strings.TrimSpace(line)
	}()
	want := `{"charged":25}`
	var killedAt atomic.Value // time.Time: when the driver's answer came
	fn := func(ctx context.Context, token uint64) (*Response, error) {
		atomic.AddInt32(&calls, 1)
		began := time.Now()
		for atomic.LoadInt32(&entered) < n {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // the others meet it in progress
		fmt.Println("IDEM-KILL-LEADER")
		select {
		case a := <-answer:
			killedAt.Store(time.Now())
			fmt.Printf("driver: %s\n", a)
		case <-time.After(30 * time.Second):
			return nil, Retryable(errors.New("the driver did not answer"))
		}
		time.Sleep(time.Until(began.Add(time.Second)))
		return &Response{Status: 201, Body: []byte(want)}, nil
	}
	req := Request{Method: "POST", Path: "/charges", Body: map[string]int{"amount": 25}}
	results, errs := runMany(c, n, key, req, 25*time.Second, &entered, fn)
	if calls != 1 {
		t.Fatalf("fn ran %d times, want exactly once", calls)
	}
	var ran, replayed int
	var failed []string
	for i := range results {
		if err := errs[i]; err != nil {
			failed = append(failed, fmt.Sprintf("caller %d: %v", i, err))
			continue
		}
		res := results[i]
		if res.Response.Status != 201 || string(res.Response.Body) != want {
			t.Fatalf("caller %d got %d %q", i, res.Response.Status, res.Response.Body)
		}
		if res.Ran == res.Replayed {
			t.Fatalf("caller %d: ran %v, replayed %v", i, res.Ran, res.Replayed)
		}
		if res.Ran {
			ran++
		} else {
			replayed++
		}
	}
	// The counts, for the driver's output (one line, whatever the outcome).
	took := -1.0
	if at, ok := killedAt.Load().(time.Time); ok {
		took = time.Since(at).Seconds()
	}
	t.Logf("leader kill: %d callers: %d ran, %d replayed, %d errors; all done %.1f s after the kill",
		n, ran, replayed, len(failed), took)
	for _, f := range failed {
		t.Log(f)
	}
	if len(failed) > 0 || ran != 1 || replayed != n-1 {
		t.Fatalf("want every caller to end with fn's response (1 ran, %d replayed): %d ran, %d replayed, %d errors",
			n-1, ran, replayed, len(failed))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := c.Run(ctx, key, req, func(context.Context, uint64) (*Response, error) {
		t.Error("fn ran again after the failover")
		return nil, Retryable(errors.New("must not run"))
	})
	if err != nil || !res.Replayed || string(res.Response.Body) != want {
		t.Fatalf("after the failover: %+v, %v", res, err)
	}
}

// The fingerprint options as the gateway applies them, through Run and the middleware: a
// retry whose ignored (or unselected) values changed is the same request and replays; one
// whose hashed values changed is the reused-key refusal. Needs a gateway that knows the
// options (run by TestGoFingerprintOptions in tests/integration/test_go_client.py).
func TestServerFingerprintOptions(t *testing.T) {
	c := itClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var runs int32
	fn := func(context.Context, uint64) (*Response, error) {
		n := atomic.AddInt32(&runs, 1)
		return &Response{Status: 201, Body: []byte(fmt.Sprintf(`{"run":%d}`, n))}, nil
	}
	order := func(body string, fields, ignore []string) Request {
		return Request{Method: "POST", Path: "/orders", Body: json.RawMessage(body),
			FingerprintFields: fields, FingerprintIgnore: ignore}
	}
	ignore := []string{"/ts", "/meta/trace~1id"}
	k1 := itKey("fp-ignore")
	res, err := c.Run(ctx, k1, order(`{"amount":10,"ts":1,"meta":{"trace/id":"a"}}`, nil, ignore), fn)
	if err != nil || !res.Ran {
		t.Fatalf("first: %+v %v", res, err)
	}
	res, err = c.Run(ctx, k1, order(`{"amount":10,"ts":2,"meta":{"trace/id":"b"}}`, nil, ignore), fn)
	if err != nil || !res.Replayed || string(res.Response.Body) != `{"run":1}` {
		t.Fatalf("ignored values changed: %+v %v", res, err)
	}
	if _, err = c.Run(ctx, k1, order(`{"amount":11,"ts":1,"meta":{"trace/id":"a"}}`, nil, ignore), fn); !errors.Is(err, ErrMismatch) {
		t.Fatalf("hashed value changed: %v", err)
	}
	fields := []string{"/amount", "/currency"}
	k2 := itKey("fp-fields")
	if res, err = c.Run(ctx, k2, order(`{"amount":5,"currency":"EUR","note":"a"}`, fields, nil), fn); err != nil || !res.Ran {
		t.Fatalf("first: %+v %v", res, err)
	}
	if res, err = c.Run(ctx, k2, order(`{"note":"b","currency":"EUR","amount":5}`, fields, nil), fn); err != nil || !res.Replayed {
		t.Fatalf("unselected value changed: %+v %v", res, err)
	}
	if _, err = c.Run(ctx, k2, order(`{"amount":5,"currency":"USD","note":"a"}`, fields, nil), fn); !errors.Is(err, ErrMismatch) {
		t.Fatalf("selected value changed: %v", err)
	}
	mustEqual(t, "runs", atomic.LoadInt32(&runs), 2)

	var handled int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&handled, 1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"order":1}`)
	})
	srv := httptest.NewServer(Middleware(c, Route{PathPrefix: "/orders", FingerprintIgnore: []string{"/ts"}})(h))
	defer srv.Close()
	key := itKey("fp-mw")
	post := func(body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if r, b := post(`{"amount":10,"ts":1}`); r.StatusCode != 201 {
		t.Fatalf("first: %d %s", r.StatusCode, b)
	}
	if r, b := post(`{"amount":10,"ts":2}`); r.StatusCode != 201 || r.Header.Get("Idempotency-Replayed") != "true" {
		t.Fatalf("ignored value changed: %d %v %s", r.StatusCode, r.Header, b)
	}
	r, b := post(`{"amount":12,"ts":1}`)
	checkGatewayProblem(t, "hashed value changed", r, b, 409, CodeMismatch, key)
	mustEqual(t, "handled", atomic.LoadInt32(&handled), 1)
}

// HTTPS against real nodes that require a client certificate: Run from 8 goroutines over
// TLS (the leader first) runs fn once; a client listing a follower first, its nodes given as
// bare host:port (https:// as TLSConfig is set), replays it through the follower; a client
// without a certificate, one that trusts another CA, and one speaking plain HTTP to the
// HTTPS port get no answer (ErrUnavailable, fn not run), the untrusted one saying why.
func TestServerTLS(t *testing.T) {
	pki := os.Getenv("IDEM_GO_PKI")
	nodes := strings.Split(os.Getenv("IDEM_GO_NODES"), ",")
	if pki == "" || len(nodes) < 2 || !strings.HasPrefix(nodes[0], "https://") {
		t.Fatal("IDEM_GO_PKI and IDEM_GO_NODES (https://) are not set: run me through " +
			"tests/integration/test_go_client.py (TestGoTls)")
	}
	pool := func(name string) *x509.CertPool {
		pem, err := os.ReadFile(pki + "/" + name)
		p := x509.NewCertPool()
		if err != nil || !p.AppendCertsFromPEM(pem) {
			t.Fatalf("%s: %v", name, err)
		}
		return p
	}
	cert, err := tls.LoadX509KeyPair(pki+"/client.crt", pki+"/client.key")
	if err != nil {
		t.Fatal(err)
	}
	client := func(nodes []string, conf *tls.Config, timeout time.Duration) *Client {
		c, err := New(Options{Nodes: nodes, Token: os.Getenv("IDEM_GO_TOKEN"), TLSConfig: conf,
			Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	trusted := &tls.Config{RootCAs: pool("ca.crt"), Certificates: []tls.Certificate{cert},
		MinVersion: tls.VersionTLS12}
	var runs int32
	fn := func(ctx context.Context, token uint64) (*Response, error) {
		atomic.AddInt32(&runs, 1)
		time.Sleep(200 * time.Millisecond) // the others meet it in progress
		return &Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(fmt.Sprintf(`{"charged":10,"fence":%d}`, token))}, nil
	}
	key := itKey("tls")
	req := Request{Method: "POST", Path: "/charges", Body: map[string]int{"amount": 10}}
	var entered int32
	results, errs := runMany(client(nodes, trusted, 0), 8, key, req, 20*time.Second, &entered, fn)
	ran, body := 0, ""
	for i, res := range results {
		if errs[i] != nil {
			t.Fatalf("caller %d over TLS: %v", i, errs[i])
		}
		if body == "" {
			body = string(res.Response.Body)
		}
		if res.Response.Status != 201 || string(res.Response.Body) != body || res.Ran == res.Replayed {
			t.Fatalf("caller %d: %+v %s (another got %s)", i, res, res.Response.Body, body)
		}
		if res.Ran {
			ran++
		}
	}
	mustEqual(t, "callers that ran fn", ran, 1)

	// Through a follower, its address bare: https:// since TLSConfig is set.
	var bare []string
	for _, n := range append(append([]string{}, nodes[1:]...), nodes[0]) {
		bare = append(bare, strings.TrimPrefix(n, "https://"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := client(bare, trusted, 0).Run(ctx, key, req, fn)
	if err != nil || !res.Replayed || string(res.Response.Body) != body {
		t.Fatalf("through a follower: %+v, %v", res, err)
	}

	refused := []struct {
		what  string
		nodes []string
		conf  *tls.Config
		says  string
	}{
		{"no client certificate", nodes, &tls.Config{RootCAs: pool("ca.crt"), MinVersion: tls.VersionTLS12}, ""},
		{"another CA", nodes, &tls.Config{RootCAs: pool("other-ca.crt"), Certificates: []tls.Certificate{cert},
			MinVersion: tls.VersionTLS12}, "certificate signed by unknown authority"},
		{"plain HTTP", []string{strings.Replace(nodes[0], "https://", "http://", 1)}, nil, ""},
	}
	for _, r := range refused {
		_, err := client(r.nodes, r.conf, time.Second).Run(context.Background(), key, req, fn)
		t.Logf("%s: %v", r.what, err)
		var e *Error
		if !errors.Is(err, ErrUnavailable) || !errors.As(err, &e) || e.Status != 0 ||
			!strings.Contains(err.Error(), r.says) {
			t.Fatalf("%s: %v, want unavailable (no answer)%s", r.what, err, r.says)
		}
	}
	mustEqual(t, "runs of fn", atomic.LoadInt32(&runs), int32(1))
}
