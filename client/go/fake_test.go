package idem

// A fake idemd gateway for the unit tests: the JSON API's routes, records with leases,
// attempt ids, replays, quarantine, released keys and the proxy's too-large marker, in
// memory, as docs/contract.md states them. Hooks inject failures in front of it.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeRec struct {
	fp         string
	state      string // processing, completed, quarantined, released
	token      uint64
	attempt    string
	leaseEnd   time.Time
	resp       *responseObject
	completion Completion
}

type fakeCall struct {
	Method, Path, Key string
	Body              []byte
	At                time.Time
}

type fakeIdem struct {
	t     *testing.T
	mu    sync.Mutex
	recs  map[string]*fakeRec
	next  uint64
	token string
	calls []fakeCall
	// hook, when set, sees every request first (n: its index among all calls); true: it
	// answered (or dropped) the request itself.
	hook func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool
	srv  *httptest.Server
}

func newFake(t *testing.T) *fakeIdem {
	f := &fakeIdem{t: t, recs: map[string]*fakeRec{}, next: 1 << 16, token: "tok"}
	f.srv = httptest.NewServer(f)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeIdem) setHook(h func(w http.ResponseWriter, r *http.Request, body []byte, n int) bool) {
	f.mu.Lock()
	f.hook = h
	f.mu.Unlock()
}

// callsTo: the calls of one path so far.
func (f *fakeIdem) callsTo(p string) []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeCall
	for _, c := range f.calls {
		if c.Path == p {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeIdem) record(key string) *fakeRec {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.recs[key]; ok {
		cp := *r
		return &cp
	}
	return nil
}

func fakeErr(w http.ResponseWriter, status int, code, msg string, retryAfter int) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Request-Id", "fake0001")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]string{"code": code, "message": msg, "request_id": "fake0001"})
	w.Write(b)
}

func fakeJSON(w http.ResponseWriter, v interface{}) {
	w.Header().Set("Content-Type", "application/json")
	b, _ := json.Marshal(v)
	w.Write(b)
}

// canonical: a JSON body re-encoded with sorted keys (encoding/json sorts map keys).
func canonical(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return "raw:" + s
	}
	var v interface{}
	if err := json.Unmarshal(raw, &v); err != nil {
		return "bad"
	}
	b, _ := json.Marshal(v)
	return "json:" + string(b)
}

// applyPointers: the fingerprint options as the fake applies them to a JSON body (not a
// string, which is hashed raw): the values the ignore pointers name removed; then, with
// fields, only the values those name ({pointer: value}, absent ones left out).
func applyPointers(raw json.RawMessage, fields, ignore []string) json.RawMessage {
	var v interface{}
	if len(fields)+len(ignore) == 0 || json.Unmarshal(raw, &v) != nil {
		return raw
	}
	if _, isString := v.(string); isString {
		return raw
	}
	for _, p := range ignore {
		v = pointerDo(v, pointerTokens(p), true)
	}
	if len(fields) > 0 {
		sel := map[string]interface{}{}
		for _, p := range fields {
			if got := pointerDo(v, pointerTokens(p), false); got != nil {
				sel[p] = got
			}
		}
		v = sel
	}
	out, _ := json.Marshal(v)
	return out
}

func pointerTokens(p string) []string {
	toks := strings.Split(p, "/")[1:]
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks
}

// pointerDo: with remove, v without the value at toks; otherwise that value (nil: none).
func pointerDo(v interface{}, toks []string, remove bool) interface{} {
	if len(toks) == 0 {
		if remove {
			return nil
		}
		return v
	}
	switch c := v.(type) {
	case map[string]interface{}:
		child, ok := c[toks[0]]
		if !ok {
			break
		}
		if remove && len(toks) == 1 {
			delete(c, toks[0])
			return c
		}
		if remove {
			c[toks[0]] = pointerDo(child, toks[1:], true)
			return c
		}
		return pointerDo(child, toks[1:], false)
	case []interface{}:
		i, err := strconv.Atoi(toks[0])
		if err != nil || i < 0 || i >= len(c) {
			break
		}
		if remove && len(toks) == 1 {
			return append(c[:i:i], c[i+1:]...)
		}
		if remove {
			c[i] = pointerDo(c[i], toks[1:], true)
			return c
		}
		return pointerDo(c[i], toks[1:], false)
	}
	if remove {
		return v
	}
	return nil
}

func (f *fakeIdem) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, fakeCall{r.Method, r.URL.Path, key, body, time.Now()})
	hook := f.hook
	f.mu.Unlock()
	if hook != nil && hook(w, r, body, n) {
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		fakeErr(w, 401, CodeUnauthenticated, "unknown or missing bearer token", 0)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/claims":
		f.claim(w, key, body)
	case r.Method == "GET" && r.URL.Path == "/v1/claims":
		f.get(w, key)
	case r.Method == "POST" && strings.HasPrefix(r.URL.Path, "/v1/claims/"):
		var tb struct {
			Token    uint64          `json:"token"`
			Outcome  Completion      `json:"outcome"`
			Response *responseObject `json:"response"`
			LeaseMS  int64           `json:"lease_ms"`
		}
		if json.Unmarshal(body, &tb) != nil {
			fakeErr(w, 400, CodeInvalidRequest, "bad body", 0)
			return
		}
		f.tokenOp(w, strings.TrimPrefix(r.URL.Path, "/v1/claims/"), key, tb.Token, tb.Outcome,
			tb.Response, tb.LeaseMS)
	default:
		fakeErr(w, 404, CodeNotFound, "no such route", 0)
	}
}

func (f *fakeIdem) claim(w http.ResponseWriter, key string, body []byte) {
	var cb claimBody
	if json.Unmarshal(body, &cb) != nil || key == "" {
		fakeErr(w, 400, CodeInvalidRequest, "bad claim", 0)
		return
	}
	fp := cb.Fingerprint
	if cb.Request != nil {
		body := applyPointers(cb.Request.Body, cb.Request.FingerprintFields, cb.Request.FingerprintIgnore)
		sum := sha256.Sum256([]byte(cb.Request.Method + "\x00" + cb.Request.Path + "\x00" +
			canonical(body) + "\x00" + strings.Join(cb.Request.FingerprintFields, "\x00") +
			"\x00" + strings.Join(cb.Request.FingerprintIgnore, "\x00")))
		fp = hex.EncodeToString(sum[:])
	}
	lease := time.Duration(cb.LeaseMS) * time.Millisecond
	if lease == 0 {
		lease = 30 * time.Second
	}
	rec := f.recs[key]
	now := time.Now()
	switch {
	case rec == nil || rec.state == "released":
		f.next++
		rec = &fakeRec{fp: fp, state: "processing", token: f.next, attempt: cb.AttemptID,
			leaseEnd: now.Add(lease)}
		f.recs[key] = rec
	case rec.fp != fp:
		fakeErr(w, 409, CodeMismatch, "the key was used with a different request", 0)
		return
	case rec.state == "completed":
		f.replay(w, rec.resp)
		return
	case rec.state == "quarantined":
		fakeErr(w, 409, CodeOutcomeUnknown, "quarantined", 0)
		return
	case rec.attempt == cb.AttemptID:
		if now.After(rec.leaseEnd) {
			rec.leaseEnd = now.Add(lease)
		}
	case now.Before(rec.leaseEnd):
		secs := int(time.Until(rec.leaseEnd)/time.Second) + 1
		fakeErr(w, 409, CodeInProgress, "in progress", secs)
		return
	default:
		fakeErr(w, 409, CodeLeaseExpired, "lease expired", 0)
		return
	}
	fakeJSON(w, map[string]interface{}{"outcome": "acquired", "token": rec.token,
		"lease_expires_at": rec.leaseEnd.UnixMilli(), "expires_at": now.Add(24 * time.Hour).UnixMilli(),
		"takeover": false, "previous_token": 0})
}

func (f *fakeIdem) replay(w http.ResponseWriter, r *responseObject) {
	if r.Body != nil && *r.Body == "" && r.BodySHA256 != "" {
		fakeErr(w, 502, CodeResponseTooLarge, "only its digest was recorded", 0)
		return
	}
	h := w.Header()
	for n, v := range r.Headers {
		h.Set(n, v)
	}
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Request-Id", "fake0002")
	h.Set("Idempotency-Replayed", "true")
	if r.BodyRef != "" {
		h.Set("Idempotency-Body-Ref", r.BodyRef)
		h.Set("Idempotency-Body-SHA256", r.BodySHA256)
	}
	w.WriteHeader(r.Status)
	if r.Body != nil {
		io.WriteString(w, *r.Body)
	}
}

func (f *fakeIdem) tokenOp(w http.ResponseWriter, op, key string, token uint64, outcome Completion,
	resp *responseObject, leaseMS int64) {
	rec := f.recs[key]
	if rec == nil || rec.state == "released" && (op != "release" || rec.token != token) {
		fakeErr(w, 404, CodeNotFound, "no such key", 0)
		return
	}
	if rec.token != token {
		fakeErr(w, 409, CodeLeaseLost, "not the holder", 0)
		return
	}
	switch op {
	case "complete":
		if outcome == "" {
			outcome = Succeeded
		}
		if rec.state != "processing" {
			if rec.completion != outcome {
				fakeErr(w, 409, CodeLeaseLost, "another outcome", 0)
				return
			}
			break
		}
		if outcome != Unknown && resp == nil {
			fakeErr(w, 400, CodeInvalidRequest, "a response is required", 0)
			return
		}
		rec.completion, rec.resp = outcome, resp
		rec.state = "completed"
		if outcome == Unknown {
			rec.state = "quarantined"
		}
	case "release":
		if rec.state != "processing" && rec.state != "released" {
			fakeErr(w, 409, CodeLeaseLost, "completed", 0)
			return
		}
		rec.state = "released"
	case "renew":
		if rec.state != "processing" {
			fakeErr(w, 409, CodeLeaseLost, "not processing", 0)
			return
		}
		lease := time.Duration(leaseMS) * time.Millisecond
		if lease == 0 {
			lease = 30 * time.Second
		}
		rec.leaseEnd = time.Now().Add(lease)
		fakeJSON(w, map[string]interface{}{"outcome": "ok", "lease_expires_at": rec.leaseEnd.UnixMilli()})
		return
	default:
		fakeErr(w, 404, CodeNotFound, "no such route", 0)
		return
	}
	fakeJSON(w, map[string]string{"outcome": "ok"})
}

func (f *fakeIdem) get(w http.ResponseWriter, key string) {
	rec := f.recs[key]
	if rec == nil || rec.state == "released" {
		fakeErr(w, 404, CodeNotFound, "no such key", 0)
		return
	}
	o := map[string]interface{}{"state": rec.state, "token": rec.token,
		"fingerprint_prefix": rec.fp[:12], "created_at": 1, "expires_at": 2,
		"lease_expires_at": rec.leaseEnd.UnixMilli()}
	if rec.resp != nil {
		o["response"] = rec.resp
	}
	fakeJSON(w, map[string]interface{}{"outcome": "ok", "record": o})
}

// client: a client of nodes (the fake's URL unless given), with short backoffs.
func (f *fakeIdem) client(t *testing.T, nodes ...string) *Client {
	if len(nodes) == 0 {
		nodes = []string{f.srv.URL}
	}
	c, err := New(Options{Nodes: nodes, Token: f.token, Timeout: 3 * time.Second,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// drop: a hook's way to lose a request: the connection is closed without an answer.
func drop(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("no hijacker")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

func attemptOf(t *testing.T, body []byte) string {
	var cb claimBody
	if err := json.Unmarshal(body, &cb); err != nil {
		t.Fatalf("claim body %q: %v", body, err)
	}
	return cb.AttemptID
}

func mustEqual(t *testing.T, what string, got, want interface{}) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}
