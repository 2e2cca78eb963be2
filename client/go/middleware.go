package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Route puts the requests whose method and path match it behind idemd (Middleware).
type Route struct {
	// Method: the request method this route takes; "" takes POST, PUT, PATCH and DELETE.
	Method string
	// PathPrefix: the route takes the path itself and every path below it ("/orders"
	// takes "/orders" and "/orders/7", not "/orderly"); a prefix ending in "/" takes what
	// follows it; "" or "/" takes every path. Paths are compared cleaned (path.Clean).
	PathPrefix string
	// KeyRequired: a request without Idempotency-Key is refused (400
	// idempotency_key_missing); by default it goes to the handler unchecked.
	KeyRequired bool
	// Lease, TTL and Policy of the claims (0 and "": the tenant's). The lease is renewed
	// every third of it while the handler runs (when 0, as Run renews the tenant's: a third
	// of a second after the claim, then a third of the lease each renewal reports).
	Lease  time.Duration
	TTL    time.Duration
	Policy Policy
	// MismatchStatus: the status of a key reused with another request, 409 (0) or 422.
	// InProgressStatus: of a request whose key another attempt holds, 409 (0) or 425.
	MismatchStatus   int
	InProgressStatus int
	// StoreHeaders: the response headers stored and replayed (nil: Content-Type and
	// Location). The JSON API replays only headers that describe a response (Content-*,
	// Location, ETag, Cache-Control, Expires, Last-Modified, Link, Retry-After, Vary):
	// others would be stored but never replayed. The first caller gets every header.
	StoreHeaders []string
	// Store4xx: a 4xx answer is stored and replayed; by default the key is released (a
	// refused request changed nothing) and the next try runs the handler again.
	Store4xx bool
	// FingerprintFields and FingerprintIgnore: JSON Pointers (RFC 6901) sent with a
	// request whose body is JSON, for the gateway to hash only those values / to leave
	// those out (Request.FingerprintFields); checked by NewMiddleware (CheckPointers).
	FingerprintFields []string
	FingerprintIgnore []string
}

var defaultStoreHeaders = []string{"Content-Type", "Location"}

// The largest request body the middleware reads (the gateway takes a claim of at most
// 1 MiB, request included), and the largest response body it stores inline (with JSON
// escaping, a complete must fit the gateway's 1 MiB body and one log entry).
const (
	maxRequestBody = 1 << 20
	maxStoredBody  = 512 << 10
)

type tokenKey struct{}

// TokenFromContext returns the fencing token of the claim a handler runs under (the
// middleware puts it in the request's context, and in its Idempotency-Fence header, as
// proxy mode sends it upstream).
func TokenFromContext(ctx context.Context) (uint64, bool) {
	t, ok := ctx.Value(tokenKey{}).(uint64)
	return t, ok
}

// Middleware puts handlers behind idemd by route, as proxy mode does for a whole service:
//
//   - A request on a matching route with an Idempotency-Key header (the key bare, or as an
//     RFC 8941 sf-string, as the gateway reads it) is claimed with its method, path (with
//     its query) and body for the gateway to fingerprint (a JSON body, by Content-Type, as
//     canonical JSON; a body that is not UTF-8 by FingerprintOf).
//   - Acquired: the handler runs once, into a recorder, with its lease renewed meanwhile;
//     a 2xx or 3xx answer is completed as succeeded, a 5xx as failed_final (both then
//     replayed to every retry), a 4xx released (unless Store4xx); then the answer goes to
//     the caller. An answer that cannot be stored inline (not UTF-8, over 512 KiB, or
//     refused by the cluster) is recorded by its SHA-256 only (its replays answer 502
//     upstream_response_too_large), and goes to the caller with Idempotency-Recorded:
//     false, as does an answer whose recording failed. A panic completes it as unknown.
//   - Replay: the stored response, with Idempotency-Replayed: true; the handler does not
//     run.
//   - Refusals, as RFC 9457 problem details written as the gateway writes its errors
//     (application/problem+json: type urn:idemd:problem:CODE, title, status, detail,
//     code, message, and request_id and instance when idemd answered): mismatch 409 (or
//     MismatchStatus), in progress 409 (or InProgressStatus) with Retry-After, lease
//     expired and outcome unknown 409, expired 410, quota 429, a bad key or body 400, a
//     body over 1 MiB 413, and 503 with Retry-After when idemd cannot be reached (fail
//     closed: the handler never runs unchecked). docs/clients.md lists them all.
//
// Requests on no route, and requests without a key (unless KeyRequired), go to the handler
// as they are, less any Idempotency-Fence header: the handler never sees a fence the caller
// sent, only the middleware's own. Middleware panics on a route NewMiddleware refuses.
func Middleware(c *Client, routes ...Route) func(http.Handler) http.Handler {
	m, err := NewMiddleware(c, routes...)
	if err != nil {
		panic(err)
	}
	return m
}

// NewMiddleware is Middleware, with an error for a route it cannot take: fingerprint
// options the gateway would refuse (errors.As finds the *FingerprintOptionError; errors.Is
// ErrInvalid holds).
func NewMiddleware(c *Client, routes ...Route) (func(http.Handler) http.Handler, error) {
	rs := append([]Route(nil), routes...)
	for i := range rs {
		if err := checkFingerprintOptions("route", rs[i].FingerprintFields, rs[i].FingerprintIgnore); err != nil {
			return nil, fmt.Errorf("idem: route %d (%s): %w", i, rs[i].PathPrefix, err)
		}
	}
	return func(next http.Handler) http.Handler {
		return &middleware{c: c, routes: rs, next: next}
	}, nil
}

type middleware struct {
	c      *Client
	routes []Route
	next   http.Handler
}

func (rt *Route) matches(r *http.Request) bool {
	if rt.Method == "" {
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		default:
			return false
		}
	} else if !strings.EqualFold(rt.Method, r.Method) {
		return false
	}
	p := path.Clean("/" + r.URL.Path)
	pre := rt.PathPrefix
	switch {
	case pre == "" || pre == "/":
		return true
	case strings.HasSuffix(pre, "/"):
		return strings.HasPrefix(p, pre) || p == strings.TrimSuffix(pre, "/")
	default:
		return p == pre || strings.HasPrefix(p, pre+"/")
	}
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(r.Header.Values("Idempotency-Fence")) > 0 {
		// A fence the caller sent is never handed on (proxy mode forwards none): the
		// handler sees only the middleware's own, of a claim it holds. The key is left as
		// it is, as the Python middlewares leave it.
		r = r.Clone(r.Context())
		r.Header.Del("Idempotency-Fence")
	}
	var rt *Route
	for i := range m.routes {
		if m.routes[i].matches(r) {
			rt = &m.routes[i]
			break
		}
	}
	if rt == nil {
		m.next.ServeHTTP(w, r)
		return
	}
	keys := r.Header.Values("Idempotency-Key")
	switch {
	case len(keys) == 0 && !rt.KeyRequired:
		m.next.ServeHTTP(w, r)
		return
	case len(keys) == 0:
		writeProblem(w, http.StatusBadRequest, CodeKeyMissing, "this route needs an Idempotency-Key", "", 0)
		return
	case keys[0] == "":
		writeProblem(w, http.StatusBadRequest, CodeKeyMissing, "the Idempotency-Key header is empty", "", 0)
		return
	case len(keys) > 1:
		writeProblem(w, http.StatusBadRequest, CodeKeyInvalid, "the Idempotency-Key header was sent twice", "", 0)
		return
	}
	key := keys[0]
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeProblem(w, http.StatusRequestEntityTooLarge, CodePayloadTooLarge, "the request body is over 1 MiB", "", 0)
		} else {
			writeProblem(w, http.StatusBadRequest, CodeInvalidRequest, "the request body could not be read", "", 0)
		}
		return
	}
	req := Request{Method: r.Method, Path: r.URL.RequestURI(), Lease: rt.Lease, TTL: rt.TTL,
		Policy: rt.Policy, AttemptID: NewAttemptID()}
	switch {
	case len(body) == 0:
	case isJSONType(r.Header.Get("Content-Type")):
		if !json.Valid(body) {
			writeProblem(w, http.StatusBadRequest, CodeInvalidRequest, "the body is labelled JSON and does not parse", "", 0)
			return
		}
		req.Body = json.RawMessage(body)
		req.FingerprintFields, req.FingerprintIgnore = rt.FingerprintFields, rt.FingerprintIgnore
	case utf8.Valid(body):
		req.Body = string(body)
	default:
		req.Fingerprint = FingerprintOf(r.Method, req.Path, body)
	}
	sent := time.Now()
	// Not under r.Context(): a caller that hangs up while the claim is on its way would
	// leave a claim that committed without its release (the call keeps its own deadline,
	// Options.Timeout).
	cl, err := m.c.Claim(context.Background(), key, req)
	if err != nil {
		rt.refuse(w, err)
		return
	}
	if cl.Replayed {
		writeReplay(w, cl.Response)
		return
	}
	if r.Context().Err() != nil {
		// The caller went away meanwhile: the handler does not run, and the key is given
		// back at once rather than held until its lease ends.
		fin, cancel := m.c.finishContext(r.Context())
		_ = m.c.Release(fin, key, cl.Token)
		cancel()
		return
	}
	m.serveClaimed(w, r, rt, key, body, cl.Token, cl.leaseLeft, sent)
}

// serveClaimed runs the handler under the claim of token and records its answer.
func (m *middleware) serveClaimed(w http.ResponseWriter, r *http.Request, rt *Route, key string,
	body []byte, token uint64, left time.Duration, sent time.Time) {
	rec := &recorder{header: http.Header{}}
	marker := false
	fn := func(ctx context.Context, token uint64) (*Response, error) {
		r2 := r.Clone(context.WithValue(ctx, tokenKey{}, token))
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		r2.Header.Set("Idempotency-Fence", strconv.FormatUint(token, 10))
		m.next.ServeHTTP(rec, r2)
		rec.finish()
		stored := rt.stored(rec)
		if !storable(stored.Body) {
			stored, marker = digestOnly(rec.status, stored.Header, rec.body.Bytes()), true
		}
		switch {
		case rec.status >= 400 && rec.status < 500 && !rt.Store4xx:
			return nil, Retryable(fmt.Errorf("the handler answered %d", rec.status))
		case rec.status >= 500 || marker:
			return stored, Final(fmt.Errorf("the handler answered %d", rec.status))
		}
		return stored, nil
	}
	_, err := m.c.runClaimed(r.Context(), key, rt.Lease, left, token, sent, fn)
	recorded := err == nil && !marker
	var fe *FinishError
	if errors.As(err, &fe) && fe.Op == "complete" && !marker &&
		(errors.Is(fe.Err, ErrInvalid) || errors.Is(fe.Err, ErrQuotaExceeded)) {
		// Refused by the cluster (too large for a log entry, the tenant's bytes quota):
		// recorded by its digest only, as proxy mode does, so that no retry runs it again.
		fin, cancel := m.c.finishContext(r.Context())
		_ = m.c.Complete(fin, key, token, FailedFinal, digestOnly(rec.status, fe.Response.Header, rec.body.Bytes()))
		cancel()
	}
	if IsRetryable(err) {
		recorded = true // released: nothing to replay, nothing to say
	}
	h := w.Header()
	for k, v := range rec.snap {
		h[k] = v
	}
	if !recorded {
		h.Set("Idempotency-Recorded", "false")
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}

// stored: the response to store, with the route's headers.
func (rt *Route) stored(rec *recorder) *Response {
	names := rt.StoreHeaders
	if names == nil {
		names = defaultStoreHeaders
	}
	h := http.Header{}
	for _, n := range names {
		if v, ok := rec.snap[http.CanonicalHeaderKey(n)]; ok {
			h[http.CanonicalHeaderKey(n)] = v
		}
	}
	return &Response{Status: rec.status, Header: h, Body: rec.body.Bytes()}
}

func storable(b []byte) bool {
	if len(b) > maxStoredBody || !utf8.Valid(b) {
		return false
	}
	enc, _ := json.Marshal(string(b))
	return len(enc) <= maxStoredBody+maxStoredBody/2
}

// digestOnly: a response recorded by its SHA-256 only (an empty inline body with the
// digest of a non-empty one: the marker proxy mode stores for an answer it cannot keep;
// its replays answer 502 upstream_response_too_large).
func digestOnly(status int, h http.Header, body []byte) *Response {
	sum := sha256.Sum256(body)
	return &Response{Status: status, Header: h, BodySHA256: hex.EncodeToString(sum[:])}
}

// refuse answers a claim that did not acquire the key (docs/contract.md, HTTP mapping),
// with the request id of idemd's answer when there was one.
func (rt *Route) refuse(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{}
	}
	rid := e.RequestID
	switch {
	case errors.Is(err, ErrMismatch):
		st := rt.MismatchStatus
		if st == 0 {
			st = http.StatusConflict
		}
		writeProblem(w, st, CodeMismatch, "the key was used with a different request", rid, 0)
	case errors.Is(err, ErrInProgress):
		st := rt.InProgressStatus
		if st == 0 {
			st = http.StatusConflict
		}
		ra := e.RetryAfter
		if ra < time.Second {
			ra = time.Second
		}
		writeProblem(w, st, CodeInProgress, "another request with this key is in progress", rid, ra)
	case errors.Is(err, ErrLeaseExpired):
		writeProblem(w, http.StatusConflict, CodeLeaseExpired, "an earlier attempt's lease passed without an outcome", rid, 0)
	case errors.Is(err, ErrUnknownOutcome):
		writeProblem(w, http.StatusConflict, CodeOutcomeUnknown, "the outcome of an earlier attempt is unknown", rid, 0)
	case errors.Is(err, ErrExpired):
		writeProblem(w, http.StatusGone, CodeKeyExpired, "the key expired", rid, 0)
	case errors.Is(err, ErrQuotaExceeded):
		writeProblem(w, http.StatusTooManyRequests, CodeQuotaExceeded, "the idempotency quota is exhausted", rid, 0)
	case errors.Is(err, ErrTooLarge) && (e.Status == http.StatusRequestEntityTooLarge || e.Status == http.StatusBadGateway):
		code := CodePayloadTooLarge
		if e.Status == http.StatusBadGateway {
			code = CodeResponseTooLarge
		}
		writeProblem(w, e.Status, code, e.Message, rid, 0)
	case errors.Is(err, ErrInvalid):
		code := e.Code
		if code != CodeKeyMissing && code != CodeKeyInvalid {
			code = CodeInvalidRequest
		}
		writeProblem(w, http.StatusBadRequest, code, e.Message, rid, 0)
	case errors.Is(err, ErrUnavailable):
		writeProblem(w, http.StatusServiceUnavailable, CodeUnavailable, "the idempotency service is unavailable; retry with the same key", rid, time.Second)
	default:
		// Unauthenticated, forbidden, internal, an unreadable answer: the service's own
		// configuration or idemd's fault; nothing ran.
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "the idempotency check failed", rid, 0)
	}
}

// problemTitles: the titles of idemd's problem types (server/http_conv.c), so that the
// middleware's refusals read as the gateway's errors do.
var problemTitles = map[string]string{
	CodeInvalidRequest:     "The request is invalid",
	CodeInvalidPath:        "The path is refused",
	CodeKeyMissing:         "The Idempotency-Key is missing",
	CodeKeyInvalid:         "The Idempotency-Key is invalid",
	CodeUnauthenticated:    "Unauthenticated",
	CodeForbidden:          "Forbidden",
	CodeNotFound:           "Not found",
	CodeMethodNotAllowed:   "Method not allowed",
	CodeInProgress:         "A request with this key is in progress",
	CodeMismatch:           "The key was used with a different request",
	CodeLeaseExpired:       "The holder's lease expired",
	CodeOutcomeUnknown:     "The outcome of an earlier attempt is unknown",
	CodeLeaseLost:          "The token is not the current holder's",
	CodeKeyExpired:         "The key expired",
	CodePayloadTooLarge:    "The body is too large",
	CodeQuotaExceeded:      "The tenant's quota is exhausted",
	CodeInternal:           "Internal error",
	"upstream_unavailable": "The upstream is unavailable",
	CodeResponseTooLarge:   "The upstream's answer is too large",
	CodeUnavailable:        "The idempotency service is unavailable",
	"upstream_timeout":     "The upstream did not answer in time",
}

// problem: an RFC 9457 problem details body, with the members (and their order) of the
// gateway's errors (docs/http-api.md, "Errors").
type problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Instance  string `json:"instance,omitempty"`
	Code      string `json:"code"`
	Message   string `json:"message"`
	RequestID string `json:"request_id,omitempty"`
}

// gatewayRequestID: whether id is one the gateway makes or takes (1-64 letters, digits,
// '-', '_', '.'), the only ones an instance URN is made of.
func gatewayRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		ch := id[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' ||
			ch == '-' || ch == '_' || ch == '.') {
			return false
		}
	}
	return true
}

// writeProblem answers a refusal as problem details (application/problem+json): request_id
// and instance (urn:idemd:request:ID) only when rid is the request id of idemd's answer
// (none for a refusal made before idemd was asked); Retry-After in whole seconds when
// retryAfter > 0. detail never holds the idempotency key.
func writeProblem(w http.ResponseWriter, status int, code, detail, rid string, retryAfter time.Duration) {
	title, ok := problemTitles[code]
	if !ok {
		title = http.StatusText(status)
	}
	if detail == "" {
		detail = title
	}
	p := problem{Type: "urn:idemd:problem:" + code, Title: title, Status: status, Detail: detail,
		Code: code, Message: detail}
	if gatewayRequestID(rid) {
		p.Instance, p.RequestID = "urn:idemd:request:"+rid, rid
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	b, _ := json.Marshal(p)
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeReplay(w http.ResponseWriter, r *Response) {
	h := w.Header()
	for k, v := range r.Header {
		h[k] = v
	}
	if r.BodyRef != "" {
		h.Set("Idempotency-Body-Ref", r.BodyRef)
		h.Set("Idempotency-Body-SHA256", r.BodySHA256)
	}
	h.Set("Idempotency-Replayed", "true")
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// recorder: what the handler answered, whole.
type recorder struct {
	header http.Header
	snap   http.Header // the header at WriteHeader
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.snap != nil || status < 200 || status > 599 {
		return // a second call, or an informational answer
	}
	r.status = status
	r.snap = r.header.Clone()
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.snap == nil {
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(b)
}

func (r *recorder) Flush() {}

// finish: as net/http would have answered (200 when nothing was written; a Content-Type
// sniffed from the body when none was set).
func (r *recorder) finish() {
	if r.snap == nil {
		r.WriteHeader(http.StatusOK)
	}
	if _, ok := r.snap["Content-Type"]; !ok && r.body.Len() > 0 {
		r.snap.Set("Content-Type", http.DetectContentType(r.body.Bytes()))
	}
}
