package idem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// Policy: what a claim does when the holder's lease has passed (docs/contract.md).
type Policy string

// The policies; PolicyDefault is the tenant's lease_policy.
const (
	PolicyDefault  Policy = ""
	PolicyConflict Policy = "conflict"
	PolicyTakeover Policy = "takeover"
)

// Completion: how an attempt ended, for Complete.
type Completion string

// The completions (docs/contract.md, "complete").
const (
	Succeeded   Completion = "succeeded"    // replayed to every retry
	FailedFinal Completion = "failed_final" // a failure with side effects: replayed as well
	Unknown     Completion = "unknown"      // side effects unknown: quarantined until resolved
)

// Request is what a claim asks for: the request to fingerprint, and the claim's options.
//
// The fingerprint tells a retry from another request under the same key. Either name the
// request (Method, Path with its query, Body) and the gateway fingerprints it, or give
// Fingerprint (64 hex digits, computed the same way on every retry of the key; see
// FingerprintOf). Do not mix the two forms for one key: that is a mismatch.
type Request struct {
	Method string
	Path   string
	// Body: nil for none; a string or []byte is fingerprinted as its raw bytes (it must be
	// UTF-8: the JSON API carries it as a JSON string; otherwise use Fingerprint); a
	// json.RawMessage, or any other value (marshalled with encoding/json), as canonical
	// JSON (keys sorted, so {"a":1,"b":2} and {"b":2,"a":1} are the same request).
	Body        interface{}
	Fingerprint string
	// FingerprintFields and FingerprintIgnore: JSON Pointers (RFC 6901) into a JSON body,
	// sent with the request for the gateway to apply before it hashes the body: only the
	// values FingerprintFields names are hashed, those FingerprintIgnore names are left
	// out (a timestamp, a trace id), so a retry that differs only there is the same
	// request. At most 32 pointers of at most 256 bytes each, each starting with "/" and
	// using "~" only in "~0" and "~1" (CheckPointers); none with Fingerprint.
	FingerprintFields []string
	FingerprintIgnore []string
	// AttemptID identifies this attempt (at most 64 bytes): a retry of the claim with the
	// same id gets its own lease back. "": Claim and Run make a fresh one per call, and
	// reuse it for their own retries.
	AttemptID string
	Lease     time.Duration // 0: the tenant's (30 s unless configured); at most 24 h
	TTL       time.Duration // how long the record is kept; 0: the tenant's (24 h)
	Policy    Policy
}

// Response is a response as idemd stores and replays it.
type Response struct {
	Status int
	// Header: the stored headers. A replay carries only those that describe a response
	// (Content-Type, Location, ETag, Cache-Control, ...: docs/http-api.md, POST
	// /v1/claims); others are stored but never replayed by the JSON API.
	Header http.Header
	Body   []byte // inline; must be UTF-8 to be stored (the JSON API carries it as a string)
	// BodyRef and BodySHA256 (64 hex digits): a body kept elsewhere, stored by reference.
	BodyRef    string
	BodySHA256 string
}

// Claimed is a claim's successful answer: acquired (run the business now, with Token)
// or a replay of the stored response.
type Claimed struct {
	Acquired       bool
	Replayed       bool
	Token          uint64    // acquired: the fencing token
	LeaseExpiresAt time.Time // acquired: the lease's end, on the cluster's clock
	ExpiresAt      time.Time // acquired: when the record's ttl ends
	Takeover       bool      // acquired by takeover of an expired lease
	PreviousToken  uint64    // with Takeover: the token fenced off
	AttemptID      string    // the attempt id the claim was sent with
	Response       *Response // replay: the stored response

	// acquired: the lease's end less the answer's Date, -1 when unknown. Date has whole
	// seconds: the lease left is at most this (when the node's clock and the cluster's
	// agree) and more than this less a second. A claim repeated by its own attempt keeps
	// the lease it has, which may be short.
	leaseLeft time.Duration
}

// Record is a key's record, as Get returns it.
type Record struct {
	State             string // processing, completed, quarantined or tombstone
	Token             uint64
	FingerprintPrefix string
	CreatedAt         time.Time
	ExpiresAt         time.Time
	LeaseExpiresAt    time.Time
	Response          *Response // when one is stored (Body nil when it was not UTF-8)
}

// ---- wire forms --------------------------------------------------------------------------

type requestObject struct {
	Method            string          `json:"method"`
	Path              string          `json:"path"`
	Body              json.RawMessage `json:"body,omitempty"`
	FingerprintFields []string        `json:"fingerprint_fields,omitempty"`
	FingerprintIgnore []string        `json:"fingerprint_ignore,omitempty"`
}

type claimBody struct {
	Fingerprint string         `json:"fingerprint,omitempty"`
	Request     *requestObject `json:"request,omitempty"`
	AttemptID   string         `json:"attempt_id"`
	LeaseMS     int64          `json:"lease_ms,omitempty"`
	TTLMS       int64          `json:"ttl_ms,omitempty"`
	Policy      Policy         `json:"policy,omitempty"`
}

type responseObject struct {
	Status     int               `json:"status"`
	Headers    map[string]string `json:"headers,omitempty"`
	Body       *string           `json:"body,omitempty"`
	BodyRef    string            `json:"body_ref,omitempty"`
	BodySHA256 string            `json:"body_sha256,omitempty"`
}

type tokenBody struct {
	Token    uint64          `json:"token"`
	Outcome  Completion      `json:"outcome,omitempty"`
	Response *responseObject `json:"response,omitempty"`
	LeaseMS  int64           `json:"lease_ms,omitempty"`
}

type okAnswer struct {
	Outcome        string      `json:"outcome"`
	Token          uint64      `json:"token"`
	LeaseExpiresAt int64       `json:"lease_expires_at"`
	ExpiresAt      int64       `json:"expires_at"`
	Takeover       bool        `json:"takeover"`
	PreviousToken  uint64      `json:"previous_token"`
	Record         *recordWire `json:"record"`
}

type recordWire struct {
	State             string          `json:"state"`
	Token             uint64          `json:"token"`
	FingerprintPrefix string          `json:"fingerprint_prefix"`
	CreatedAt         int64           `json:"created_at"`
	ExpiresAt         int64           `json:"expires_at"`
	LeaseExpiresAt    int64           `json:"lease_expires_at"`
	Response          *storedResponse `json:"response"`
}

type storedResponse struct {
	Status     int               `json:"status"`
	Headers    map[string]string `json:"headers"`
	Body       *string           `json:"body"`
	BodyRef    string            `json:"body_ref"`
	BodySHA256 string            `json:"body_sha256"`
}

func ms(t int64) time.Time {
	if t <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(t)
}

// ---- checks ------------------------------------------------------------------------------

// checkKey returns the key that key names, by the key rule of docs/contract.md (1-255
// bytes of A-Z a-z 0-9 . _ : ~ -), checked here too, since the key travels in a header (a
// tenant may lower the maximum: the node judges that). A key written as an RFC 8941
// sf-string ("order-1", as the IETF draft writes the header) names the key between its
// quotes, as the gateway takes it (docs/http-api.md, "Keys in headers"): the same key as
// the bare one, sent bare; a bad sf-string is refused as the gateway refuses it.
func checkKey(op, key string) (string, error) {
	if s, isSF, why := sfString(key); why != "" {
		return "", invalidError(op, CodeKeyInvalid, "the key is a bad sf-string: %s", why)
	} else if isSF {
		key = s
	}
	if key == "" {
		return "", invalidError(op, CodeKeyMissing, "empty key")
	}
	if len(key) > 255 {
		return "", invalidError(op, CodeKeyInvalid, "key longer than 255 bytes")
	}
	for i := 0; i < len(key); i++ {
		ch := key[i]
		ok := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' ||
			strings.IndexByte("._:~-", ch) >= 0
		if !ok {
			return "", invalidError(op, CodeKeyInvalid, "key byte %d is outside [A-Za-z0-9._:~-]", i)
		}
	}
	return key, nil
}

// sfString decodes v as an RFC 8941 sf-string (section 4.2.5; spaces around it skipped, as
// a field value's are) by the gateway's rule (server/http_conv.c, http_sf_string): isSF
// false when v does not begin with a double quote (not an sf-string: the value is taken as
// it is); otherwise the string between the quotes ('\"' for '"', '\\' for '\'), or why
// it is not a valid one.
func sfString(v string) (s string, isSF bool, why string) {
	i := 0
	for i < len(v) && v[i] == ' ' {
		i++
	}
	if i == len(v) || v[i] != '"' {
		return "", false, ""
	}
	var b strings.Builder
	for i++; i < len(v); i++ {
		ch := v[i]
		switch {
		case ch == '\\':
			if i+1 == len(v) {
				return "", true, "no closing double quote"
			}
			i++
			if v[i] != '"' && v[i] != '\\' {
				return "", true, "a backslash may only escape a double quote or a backslash"
			}
			b.WriteByte(v[i])
		case ch == '"':
			if strings.TrimLeft(v[i+1:], " ") != "" {
				return "", true, "something follows the closing double quote (parameters are not accepted)"
			}
			return b.String(), true, ""
		case ch < 0x20 || ch > 0x7e:
			return "", true, "a byte outside printable ASCII (0x20-0x7e)"
		default:
			b.WriteByte(ch)
		}
	}
	return "", true, "no closing double quote"
}

func isTokenChar(ch byte) bool {
	return ch > ' ' && ch < 0x7f && !strings.ContainsRune("\"(),/:;<=>?@[\\]{}", rune(ch))
}

func validHeaderName(n string) bool {
	if n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		if !isTokenChar(n[i]) {
			return false
		}
	}
	return true
}

func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if ch := v[i]; ch < ' ' && ch != '\t' || ch == 0x7f {
			return false
		}
	}
	return true
}

// responseWire checks a response and builds its wire form; an *Error (ErrInvalid) names
// what cannot be stored.
func responseWire(op string, r *Response) (*responseObject, error) {
	if r.Status < 200 || r.Status > 599 {
		return nil, invalidError(op, CodeInvalidRequest, "response status %d outside 200-599", r.Status)
	}
	o := &responseObject{Status: r.Status, BodyRef: r.BodyRef, BodySHA256: r.BodySHA256}
	if len(r.Header) > 0 {
		o.Headers = make(map[string]string, len(r.Header))
		for name, vals := range r.Header {
			v := strings.Join(vals, ", ")
			if !validHeaderName(name) || !validHeaderValue(v) {
				return nil, invalidError(op, CodeInvalidRequest, "response header %q cannot be stored", name)
			}
			o.Headers[strings.ToLower(name)] = v
		}
		if len(o.Headers) > 64 {
			return nil, invalidError(op, CodeInvalidRequest, "more than 64 response headers")
		}
	}
	if r.BodyRef == "" || len(r.Body) > 0 {
		if !utf8.Valid(r.Body) {
			return nil, invalidError(op, CodeInvalidRequest,
				"the response body is not UTF-8: the JSON API stores only UTF-8 bodies inline "+
					"(store it elsewhere and give BodyRef and BodySHA256)")
		}
		s := string(r.Body)
		o.Body = &s
	}
	return o, nil
}

// The fingerprint options' limits (docs/http-api.md, POST /v1/claims).
const (
	MaxPointers     = 32
	MaxPointerBytes = 256
)

// FingerprintOptionError is a fingerprint option (fingerprint_fields or
// fingerprint_ignore) refused on this side, before anything is sent, by the rule the
// gateway applies. errors.Is(err, ErrInvalid) holds for it.
type FingerprintOptionError struct {
	Option  string // "fingerprint_fields" or "fingerprint_ignore"
	Index   int    // the pointer's place in the list; -1 when the list itself is wrong
	Pointer string // the pointer refused ("" when Index is -1)
	Reason  string // the rule it broke
}

func (e *FingerprintOptionError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("%s: %s", e.Option, e.Reason)
	}
	p := e.Pointer
	if len(p) > 64 {
		p = p[:61] + "..."
	}
	return fmt.Sprintf("%s[%d] %q: %s", e.Option, e.Index, p, e.Reason)
}

// Is makes errors.Is(err, ErrInvalid) true: the request is wrong as written.
func (e *FingerprintOptionError) Is(target error) bool { return target == ErrInvalid }

// CheckPointers checks the JSON Pointers of a fingerprint option (option names it in the
// error) by the gateway's rule: at most MaxPointers, each 1 to MaxPointerBytes bytes of
// UTF-8 starting with "/", with "~" only in the escapes "~0" ("~") and "~1" ("/"). The
// error is a *FingerprintOptionError.
func CheckPointers(option string, ptrs []string) error {
	if len(ptrs) > MaxPointers {
		return &FingerprintOptionError{Option: option, Index: -1,
			Reason: fmt.Sprintf("%d pointers, over the limit of %d", len(ptrs), MaxPointers)}
	}
	for i, p := range ptrs {
		why := ""
		switch {
		case !strings.HasPrefix(p, "/"):
			why = `a pointer starts with "/"`
		case len(p) > MaxPointerBytes:
			why = fmt.Sprintf("%d bytes, over the limit of %d", len(p), MaxPointerBytes)
		case !utf8.ValidString(p):
			why = "not UTF-8"
		}
		for j := 0; why == "" && j < len(p); j++ {
			if p[j] == '~' && (j+1 == len(p) || p[j+1] != '0' && p[j+1] != '1') {
				why = fmt.Sprintf(`"~" at offset %d is not "~0" or "~1"`, j)
			}
		}
		if why != "" {
			return &FingerprintOptionError{Option: option, Index: i, Pointer: p, Reason: why}
		}
	}
	return nil
}

// checkFingerprintOptions: both lists of a request, as an *Error (ErrInvalid) wrapping the
// *FingerprintOptionError (errors.As finds it).
func checkFingerprintOptions(op string, fields, ignore []string) error {
	for _, o := range []struct {
		name string
		ptrs []string
	}{{"fingerprint_fields", fields}, {"fingerprint_ignore", ignore}} {
		if err := CheckPointers(o.name, o.ptrs); err != nil {
			return &Error{Op: op, Code: CodeInvalidRequest, Message: "fingerprint option refused", Err: err}
		}
	}
	return nil
}

// requestWire: the claim body of req.
func requestWire(op string, req *Request) (*claimBody, error) {
	b := &claimBody{AttemptID: req.AttemptID, Policy: req.Policy,
		LeaseMS: req.Lease.Milliseconds(), TTLMS: req.TTL.Milliseconds()}
	if err := checkFingerprintOptions(op, req.FingerprintFields, req.FingerprintIgnore); err != nil {
		return nil, err
	}
	if req.Fingerprint != "" {
		if len(req.FingerprintFields)+len(req.FingerprintIgnore) > 0 {
			return nil, invalidError(op, CodeInvalidRequest,
				"fingerprint options apply to a request the gateway fingerprints, not to a Fingerprint")
		}
		if _, err := hex.DecodeString(req.Fingerprint); err != nil || len(req.Fingerprint) != 64 {
			return nil, invalidError(op, CodeInvalidRequest, "fingerprint must be 64 hex digits")
		}
		b.Fingerprint = strings.ToLower(req.Fingerprint)
		return b, nil
	}
	if req.Method == "" || req.Path == "" {
		return nil, invalidError(op, CodeInvalidRequest, "the request needs a method and a path, or a fingerprint")
	}
	ro := &requestObject{Method: req.Method, Path: req.Path,
		FingerprintFields: req.FingerprintFields, FingerprintIgnore: req.FingerprintIgnore}
	var err error
	switch v := req.Body.(type) {
	case nil:
	case string:
		ro.Body, err = rawString(op, []byte(v))
	case []byte:
		ro.Body, err = rawString(op, v)
	case json.RawMessage:
		if !json.Valid(v) {
			return nil, invalidError(op, CodeInvalidRequest, "the request body is not valid JSON")
		}
		ro.Body = v
	default:
		ro.Body, err = json.Marshal(v)
		if err != nil {
			return nil, invalidError(op, CodeInvalidRequest, "the request body: %v", err)
		}
	}
	if err != nil {
		return nil, err
	}
	b.Request = ro
	return b, nil
}

func rawString(op string, b []byte) (json.RawMessage, error) {
	if !utf8.Valid(b) {
		return nil, invalidError(op, CodeInvalidRequest,
			"a request body that is not UTF-8 cannot be sent for the gateway to fingerprint: "+
				"give a Fingerprint (FingerprintOf)")
	}
	return json.Marshal(string(b))
}

// FingerprintOf computes a fingerprint (64 hex digits) of a request on the client's side:
// SHA-256 over a tag, the method, the path and the body, each framed by its length. Use
// it as Request.Fingerprint where the gateway cannot fingerprint the request (a body that
// is not UTF-8), the same way on every retry of a key. It is not the gateway's
// fingerprint: a key claimed one way and retried the other is a mismatch.
func FingerprintOf(method, path string, body []byte) string {
	h := sha256.New()
	for _, f := range [][]byte{[]byte("idem-go-fp-v1"), []byte(strings.ToUpper(method)),
		[]byte(sortedQuery(path)), body} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// sortedQuery: the path with its query's parameters sorted (as the gateway's fingerprint
// sorts them), "/a?" as "/a".
func sortedQuery(p string) string {
	i := strings.IndexByte(p, '?')
	if i < 0 {
		return p
	}
	q := strings.Split(p[i+1:], "&")
	sort.Strings(q)
	if len(q) == 1 && q[0] == "" {
		return p[:i]
	}
	return p[:i] + "?" + strings.Join(q, "&")
}

// replayResponse: the stored response a replay answer carries (the headers idemd added to
// it taken out; a body kept by reference from its Idempotency-Body-* headers).
func replayResponse(a *answer) *Response {
	r := &Response{Status: a.status, Header: http.Header{}, Body: a.body}
	for name, vals := range a.header {
		switch name {
		case "Content-Length", "Date", "Connection", "Keep-Alive", "Transfer-Encoding", "Server",
			"X-Request-Id", "Idempotency-Replayed", "X-Content-Type-Options",
			"Idempotency-Attempt": // the replaying claim's own attempt, not stored
			continue
		case "Idempotency-Body-Ref":
			r.BodyRef = vals[0]
		case "Idempotency-Body-Sha256":
			r.BodySHA256 = vals[0]
		default:
			r.Header[name] = append([]string(nil), vals...)
		}
	}
	if r.BodyRef != "" && len(r.Body) == 0 {
		r.Body = nil
	}
	return r
}

func isReplay(a *answer) bool {
	return strings.EqualFold(a.header.Get("Idempotency-Replayed"), "true")
}

// decodeOK reads a 200 answer with outcome want.
func decodeOK(op string, a *answer, want string) (*okAnswer, error) {
	var o okAnswer
	if a.status != http.StatusOK || !isJSONType(a.header.Get("Content-Type")) ||
		json.Unmarshal(a.body, &o) != nil || o.Outcome != want {
		e := answerError(op, a.node, a.status, a.header, a.body)
		if a.status/100 == 2 {
			e.Code = codeProtocol
			e.Message = "an answer that is not " + want
		}
		return nil, e
	}
	return &o, nil
}

// ---- the calls -----------------------------------------------------------------------------

// Claim asks whether the request named by key may run now (POST /v1/claims). It returns
// Claimed (acquired, or a replay of the stored response), or an *Error: ErrInProgress
// (RetryAfter set), ErrMismatch, ErrLeaseExpired, ErrUnknownOutcome, ErrExpired,
// ErrQuotaExceeded, ErrInvalid, ErrUnauthorized, ErrForbidden, ErrUnavailable, ... A claim
// whose answer was lost (a timeout, a connection failure, a 503) is retried with the same
// attempt id until ctx's deadline (or Options.Timeout), so that it gets its own lease back.
func (c *Client) Claim(ctx context.Context, key string, req Request) (*Claimed, error) {
	key, err := checkKey("claim", key)
	if err != nil {
		return nil, err
	}
	if req.AttemptID == "" {
		req.AttemptID = NewAttemptID()
	}
	if len(req.AttemptID) > 64 {
		return nil, invalidError("claim", CodeInvalidRequest, "attempt id longer than 64 bytes")
	}
	wire, err := requestWire("claim", &req)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(wire)
	if err != nil {
		return nil, invalidError("claim", CodeInvalidRequest, "%v", err)
	}
	a, err := c.do(ctx, "claim", http.MethodPost, "/v1/claims", key, body)
	if err != nil {
		return nil, err
	}
	if isReplay(a) {
		return &Claimed{Replayed: true, AttemptID: req.AttemptID, Response: replayResponse(a)}, nil
	}
	o, err := decodeOK("claim", a, "acquired")
	if err != nil {
		return nil, err
	}
	return &Claimed{Acquired: true, Token: o.Token, LeaseExpiresAt: ms(o.LeaseExpiresAt),
		ExpiresAt: ms(o.ExpiresAt), Takeover: o.Takeover, PreviousToken: o.PreviousToken,
		AttemptID: req.AttemptID, leaseLeft: leaseLeft(o.LeaseExpiresAt, a.header)}, nil
}

// leaseLeft: a lease ending at end (ms on the cluster's clock) less the answer's Date
// header (whole seconds: an upper bound of the lease left); -1 when either is unknown.
func leaseLeft(end int64, h http.Header) time.Duration {
	date, err := http.ParseTime(h.Get("Date"))
	if end <= 0 || err != nil {
		return -1
	}
	left := time.UnixMilli(end).Sub(date)
	if left < 0 {
		return 0
	}
	return left
}

// Complete stores the result of the attempt holding token and ends its lease. outcome
// Unknown quarantines the record and may have a nil resp. Repeating it with the same token
// and outcome answers nil again. Errors: ErrLeaseLost, ErrNotFound, ErrQuotaExceeded,
// ErrInvalid (a response that cannot be stored, or too large for a log entry), ...
func (c *Client) Complete(ctx context.Context, key string, token uint64, outcome Completion, resp *Response) error {
	tb := tokenBody{Token: token, Outcome: outcome}
	if resp != nil {
		w, err := responseWire("complete", resp)
		if err != nil {
			return err
		}
		tb.Response = w
	} else if outcome != Unknown {
		return invalidError("complete", CodeInvalidRequest, "a %s completion needs a response", outcome)
	}
	_, _, err := c.tokenCall(ctx, "complete", key, &tb)
	return err
}

// Release gives the key back after an attempt that changed nothing: the next claim runs
// again. Errors: ErrLeaseLost, ErrNotFound, ...
func (c *Client) Release(ctx context.Context, key string, token uint64) error {
	_, _, err := c.tokenCall(ctx, "release", key, &tokenBody{Token: token})
	return err
}

// Renew extends the lease of token to the cluster's now + lease (0: the tenant's lease)
// and returns its new end, on the cluster's clock. Errors: ErrLeaseLost, ErrNotFound, ...
func (c *Client) Renew(ctx context.Context, key string, token uint64, lease time.Duration) (time.Time, error) {
	end, _, err := c.renew(ctx, key, token, lease)
	return end, err
}

// renew is Renew, with the lease its answer leaves: the new end less the answer's Date, as
// Claimed.leaseLeft (-1 when unknown).
func (c *Client) renew(ctx context.Context, key string, token uint64, lease time.Duration) (time.Time, time.Duration, error) {
	o, h, err := c.tokenCall(ctx, "renew", key, &tokenBody{Token: token, LeaseMS: lease.Milliseconds()})
	if err != nil {
		return time.Time{}, -1, err
	}
	return ms(o.LeaseExpiresAt), leaseLeft(o.LeaseExpiresAt, h), nil
}

// tokenCall: complete, release or renew (op), and its answer with the answer's headers.
func (c *Client) tokenCall(ctx context.Context, op, key string, tb *tokenBody) (*okAnswer, http.Header, error) {
	key, err := checkKey(op, key)
	if err != nil {
		return nil, nil, err
	}
	body, err := json.Marshal(tb)
	if err != nil {
		return nil, nil, invalidError(op, CodeInvalidRequest, "%v", err)
	}
	a, err := c.do(ctx, op, http.MethodPost, "/v1/claims/"+op, key, body)
	if err != nil {
		return nil, nil, err
	}
	o, err := decodeOK(op, a, "ok")
	if err != nil {
		return nil, nil, err
	}
	return o, a.header, nil
}

// Get reads the key's record through the cluster's log (GET /v1/claims). ErrNotFound when
// there is none (or only a released one).
func (c *Client) Get(ctx context.Context, key string) (*Record, error) {
	key, err := checkKey("get", key)
	if err != nil {
		return nil, err
	}
	a, err := c.do(ctx, "get", http.MethodGet, "/v1/claims", key, nil)
	if err != nil {
		return nil, err
	}
	o, err := decodeOK("get", a, "ok")
	if err != nil {
		return nil, err
	}
	if o.Record == nil {
		return nil, &Error{Op: "get", Status: a.status, Code: codeProtocol, Node: a.node,
			Message: "an answer without a record"}
	}
	w := o.Record
	rec := &Record{State: w.State, Token: w.Token, FingerprintPrefix: w.FingerprintPrefix,
		CreatedAt: ms(w.CreatedAt), ExpiresAt: ms(w.ExpiresAt), LeaseExpiresAt: ms(w.LeaseExpiresAt)}
	if s := w.Response; s != nil {
		r := &Response{Status: s.Status, Header: http.Header{}, BodyRef: s.BodyRef, BodySHA256: s.BodySHA256}
		for n, v := range s.Headers {
			r.Header.Set(n, v)
		}
		if s.Body != nil {
			r.Body = []byte(*s.Body)
		}
		rec.Response = r
	}
	return rec, nil
}
