package idem

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The error codes of idemd's answers (docs/http-api.md, "Errors"): an *Error carries one
// in Code, and errors.Is matches it against the sentinel errors below.
const (
	CodeInvalidRequest      = "invalid_request"
	CodeInvalidPath         = "invalid_path"
	CodeKeyMissing          = "idempotency_key_missing"
	CodeKeyInvalid          = "idempotency_key_invalid"
	CodeUnauthenticated     = "unauthenticated"
	CodeForbidden           = "forbidden"
	CodeNotFound            = "not_found"
	CodeMethodNotAllowed    = "method_not_allowed"
	CodeInProgress          = "idempotency_request_in_progress"
	CodeMismatch            = "idempotency_key_reused"
	CodeLeaseExpired        = "idempotency_lease_expired"
	CodeOutcomeUnknown      = "idempotency_outcome_unknown"
	CodeLeaseLost           = "idempotency_lease_lost"
	CodeKeyExpired          = "idempotency_key_expired"
	CodePayloadTooLarge     = "payload_too_large"
	CodeQuotaExceeded       = "idempotency_quota_exceeded"
	CodeInternal            = "internal"
	CodeResponseTooLarge    = "upstream_response_too_large"
	CodeUnavailable         = "idempotency_unavailable"
	codeProtocol            = "protocol" // the client's own: an answer it cannot read
	maxRetryAfterHeaderSecs = 86400
)

// Sentinel errors. Every error the client returns for an answer of idemd (or for no
// answer) is an *Error; errors.Is(err, ErrMismatch) and the like test its Code.
var (
	// ErrInvalid: the request is malformed and was refused as it stands (invalid_request,
	// invalid_path, idempotency_key_missing, idempotency_key_invalid, method_not_allowed,
	// or a request the client refused before sending it). The same request never succeeds.
	ErrInvalid = errors.New("idem: invalid request")
	// ErrUnauthorized: no bearer token, or an unknown one (401 unauthenticated).
	ErrUnauthorized = errors.New("idem: unauthenticated")
	// ErrForbidden: the admin token was used for a data operation (403 forbidden).
	ErrForbidden = errors.New("idem: forbidden")
	// ErrNotFound: no record for the key (404 not_found).
	ErrNotFound = errors.New("idem: not found")
	// ErrInProgress: another attempt holds the key's lease (409
	// idempotency_request_in_progress); Error.RetryAfter says how long it has left.
	ErrInProgress = errors.New("idem: request in progress")
	// ErrMismatch: the key was used with a different request (409 idempotency_key_reused).
	ErrMismatch = errors.New("idem: key reused with a different request")
	// ErrLeaseExpired: the holder's lease passed and the policy is conflict (409
	// idempotency_lease_expired).
	ErrLeaseExpired = errors.New("idem: the holder's lease expired")
	// ErrUnknownOutcome: the record is quarantined, its outcome unknown until an operator
	// resolves it (409 idempotency_outcome_unknown); Run also returns it after completing
	// with outcome unknown.
	ErrUnknownOutcome = errors.New("idem: outcome unknown")
	// ErrLeaseLost: complete, release or renew with a token that is not the current one
	// (409 idempotency_lease_lost).
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrExpired: the record expired; its tombstone remains (410 idempotency_key_expired).
	ErrExpired = errors.New("idem: key expired")
	// ErrTooLarge: the request was too large (413 payload_too_large), or the stored
	// answer was too large to keep and only its digest was recorded (502
	// upstream_response_too_large).
	ErrTooLarge = errors.New("idem: too large")
	// ErrQuotaExceeded: the tenant's records or bytes quota (429
	// idempotency_quota_exceeded).
	ErrQuotaExceeded = errors.New("idem: quota exceeded")
	// ErrInternal: a fault inside the node (500 internal).
	ErrInternal = errors.New("idem: internal error")
	// ErrUnavailable: no answer from a leader before the deadline (503
	// idempotency_unavailable after the retries, or no node reachable). The request may or
	// may not have been applied: retry it with the same key (and, for a claim, the same
	// attempt id).
	ErrUnavailable = errors.New("idem: unavailable")
	// ErrProtocol: an answer the client cannot read (not idemd's JSON, an unknown status).
	ErrProtocol = errors.New("idem: unexpected answer")
)

var codeSentinels = map[string]error{
	CodeInvalidRequest:   ErrInvalid,
	CodeInvalidPath:      ErrInvalid,
	CodeKeyMissing:       ErrInvalid,
	CodeKeyInvalid:       ErrInvalid,
	CodeMethodNotAllowed: ErrInvalid,
	CodeUnauthenticated:  ErrUnauthorized,
	CodeForbidden:        ErrForbidden,
	CodeNotFound:         ErrNotFound,
	CodeInProgress:       ErrInProgress,
	CodeMismatch:         ErrMismatch,
	CodeLeaseExpired:     ErrLeaseExpired,
	CodeOutcomeUnknown:   ErrUnknownOutcome,
	CodeLeaseLost:        ErrLeaseLost,
	CodeKeyExpired:       ErrExpired,
	CodePayloadTooLarge:  ErrTooLarge,
	CodeResponseTooLarge: ErrTooLarge,
	CodeQuotaExceeded:    ErrQuotaExceeded,
	CodeInternal:         ErrInternal,
	CodeUnavailable:      ErrUnavailable,
	codeProtocol:         ErrProtocol,
}

// statusSentinels: for a code this client does not know, the status decides.
var statusSentinels = map[int]error{
	400: ErrInvalid, 401: ErrUnauthorized, 403: ErrForbidden, 404: ErrNotFound,
	405: ErrInvalid, 410: ErrExpired, 413: ErrTooLarge, 429: ErrQuotaExceeded,
	500: ErrInternal, 502: ErrUnavailable, 503: ErrUnavailable, 504: ErrUnavailable,
}

// Error is what the client returns for an answer of idemd that is not a success, and for
// no answer at all (Code idempotency_unavailable, Status 0 or the last 503's, Err the
// cause). Branch with errors.Is against the sentinels (ErrMismatch, ...) or on Code.
type Error struct {
	Op         string        // "claim", "complete", "release", "renew", "get", "run"
	Status     int           // the HTTP status; 0 when no answer came
	Code       string        // the answer's `code` (Code* constants)
	Message    string        // the answer's message, for people
	RequestID  string        // the answer's request_id (X-Request-Id)
	RetryAfter time.Duration // Retry-After, when the answer had one
	Node       string        // the node that answered, or was tried last
	Err        error         // the cause, when there is one (a network error, ctx's error, fn's error)
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("idem")
	if e.Op != "" {
		b.WriteString(": " + e.Op)
	}
	if e.Status != 0 {
		fmt.Fprintf(&b, ": %d", e.Status)
	}
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	if e.RequestID != "" {
		b.WriteString(" (request " + e.RequestID + ")")
	}
	return b.String()
}

// Unwrap returns the cause (a network error, the context's error, fn's error), if any.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel of e's code (or, for a code this client does
// not know, of its status; ErrProtocol for a status it does not know either).
func (e *Error) Is(target error) bool {
	if s, ok := codeSentinels[e.Code]; ok {
		return s == target
	}
	if s, ok := statusSentinels[e.Status]; ok {
		return s == target
	}
	return target == ErrProtocol && e.Status != 0
}

// errorBody is idemd's error body, and the members of an RFC 9457 problem+json body that
// can stand in for its message; other members are ignored.
type errorBody struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	RequestID string `json:"request_id"`
	Detail    string `json:"detail"`
	Title     string `json:"title"`
}

// answerError turns an answer that is not a success into an *Error, keyed on its JSON
// `code` (application/json or application/problem+json, extra members tolerated).
func answerError(op, node string, status int, h http.Header, body []byte) *Error {
	e := &Error{Op: op, Status: status, Node: node, RequestID: h.Get("X-Request-Id")}
	var eb errorBody
	if isJSONType(h.Get("Content-Type")) && json.Unmarshal(body, &eb) == nil {
		e.Code = eb.Code
		e.Message = firstNonEmpty(eb.Message, eb.Detail, eb.Title)
		if eb.RequestID != "" {
			e.RequestID = eb.RequestID
		}
	}
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	e.RetryAfter = parseRetryAfter(h.Get("Retry-After"))
	return e
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// isJSONType: application/json, or any */*+json (application/problem+json).
func isJSONType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// parseRetryAfter reads Retry-After as seconds or as an HTTP date; 0 when absent or bad.
func parseRetryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return 0
		}
		if n > maxRetryAfterHeaderSecs {
			n = maxRetryAfterHeaderSecs
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// invalidError is the client's own refusal of a request it will not send.
func invalidError(op, code, format string, args ...interface{}) *Error {
	return &Error{Op: op, Code: code, Message: fmt.Sprintf(format, args...)}
}
