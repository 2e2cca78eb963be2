package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	DefaultTimeout        = 5 * time.Second
	DefaultAttemptTimeout = 3 * time.Second
	DefaultBackoffBase    = 10 * time.Millisecond
	DefaultBackoffMax     = 1 * time.Second
	DefaultFinishTimeout  = 15 * time.Second
	minAttemptTimeout     = 250 * time.Millisecond
	maxAnswerBytes        = 64 << 20
)

// Options say how to reach the cluster.
type Options struct {
	// Nodes: the gateways of the cluster's nodes, as base URLs ("http://10.0.0.1:8001",
	// "https://idem-1.example:8443"); a bare "host:port" means http://, or https:// when
	// TLSConfig is set. Required. Any node serves any request (a follower forwards it to
	// the leader); the client sends to one node and moves to the next after a connection
	// failure or a 503.
	Nodes []string
	// Token: the tenant's bearer token, sent with every request.
	Token string
	// TLSConfig: for https:// nodes (server verification, client certificates). Cloned.
	TLSConfig *tls.Config
	// Timeout: the deadline of a call whose context has none (0: DefaultTimeout). A call
	// retries connection failures and 503s with the same request until its deadline.
	Timeout time.Duration
	// AttemptTimeout caps one attempt (connect, send, answer): a third of the call's time
	// left, at least 250 ms, at most this (0: DefaultAttemptTimeout, above the gateway's
	// own 2 s deadline, so a node's 503 normally arrives before the client gives up on it).
	AttemptTimeout time.Duration
	// BackoffBase and BackoffMax: the backoff between retries, doubling from BackoffBase
	// up to BackoffMax, half of it random (0: DefaultBackoffBase, DefaultBackoffMax). A
	// 503's Retry-After is waited at least. Run also polls a key in progress this way.
	BackoffBase, BackoffMax time.Duration
	// FinishTimeout: how long Run (and the middleware) keep retrying the complete or
	// release after the function ran, whatever the caller's context says by then (0:
	// DefaultFinishTimeout, or the caller's deadline when that is later). A response
	// that could not be recorded by then leaves the key processing until its lease ends.
	FinishTimeout time.Duration
	// HTTPClient, when set, sends the requests (its Timeout should be 0: the client sets
	// each attempt's deadline). Otherwise the client makes its own, with TLSConfig.
	HTTPClient *http.Client
}

// Client is a client of idemd's HTTP JSON API (docs/http-api.md). It is safe for
// concurrent use by any number of goroutines.
type Client struct {
	nodes []string
	token string
	opts  Options
	hc    *http.Client
	own   *http.Transport // the transport New made, closed by Close; nil otherwise
	cur   atomic.Uint32   // the node requests go to (modulo len(nodes)); moved on after a failure

	rmu sync.Mutex
	rnd *mrand.Rand
}

// New makes a client. It connects to nothing yet.
func New(opts Options) (*Client, error) {
	if len(opts.Nodes) == 0 {
		return nil, invalidError("new", CodeInvalidRequest, "no nodes")
	}
	if strings.ContainsAny(opts.Token, "\r\n\x00") {
		return nil, invalidError("new", CodeInvalidRequest, "the token has a control character")
	}
	c := &Client{token: opts.Token, opts: opts,
		rnd: mrand.New(mrand.NewSource(time.Now().UnixNano()))}
	for i, n := range opts.Nodes {
		u, err := nodeURL(n, opts.TLSConfig != nil)
		if err != nil {
			return nil, invalidError("new", CodeInvalidRequest, "node %d %q: %v", i+1, n, err)
		}
		c.nodes = append(c.nodes, u)
	}
	setDefault(&c.opts.Timeout, DefaultTimeout)
	setDefault(&c.opts.AttemptTimeout, DefaultAttemptTimeout)
	setDefault(&c.opts.BackoffBase, DefaultBackoffBase)
	setDefault(&c.opts.BackoffMax, DefaultBackoffMax)
	setDefault(&c.opts.FinishTimeout, DefaultFinishTimeout)
	if opts.HTTPClient != nil {
		c.hc = opts.HTTPClient
		return c, nil
	}
	t := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		TLSHandshakeTimeout: 0, // bounded by each attempt's deadline
		// The gateway speaks HTTP/1.1 only (ALPN http/1.1).
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	if opts.TLSConfig != nil {
		t.TLSClientConfig = opts.TLSConfig.Clone()
	}
	c.own = t
	c.hc = &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // idemd does not redirect; never follow one elsewhere
	}}
	return c, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Close closes the idle connections of the client's own transport.
func (c *Client) Close() {
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

func nodeURL(n string, tlsOn bool) (string, error) {
	n = strings.TrimSpace(n)
	if !strings.Contains(n, "://") {
		if tlsOn {
			n = "https://" + n
		} else {
			n = "http://" + n
		}
	}
	u, err := url.Parse(n)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" || u.Port() == "" {
		return "", errors.New("want host:port")
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", errors.New("want scheme://host:port[/path]")
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"), nil
}

// NewAttemptID returns a fresh random attempt id (32 hex digits), as Run and Claim make
// one when the request names none.
func NewAttemptID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("idem: no randomness: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// answer: an HTTP answer of a node, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
	node   string
}

// callContext bounds a call by Options.Timeout when ctx has no deadline.
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.opts.Timeout)
}

// attemptTimeout: a third of the time left, at least 250 ms, at most AttemptTimeout,
// never past the call's deadline.
func (c *Client) attemptTimeout(ctx context.Context) time.Duration {
	dl, _ := ctx.Deadline()
	left := time.Until(dl)
	d := left / 3
	if d < minAttemptTimeout {
		d = minAttemptTimeout
	}
	if d > c.opts.AttemptTimeout {
		d = c.opts.AttemptTimeout
	}
	if d > left {
		d = left
	}
	return d
}

// backoff: BackoffBase doubled per try up to BackoffMax, the upper half of it random.
func (c *Client) backoff(try int) time.Duration {
	d := c.opts.BackoffBase
	for i := 0; i < try && d < c.opts.BackoffMax; i++ {
		d *= 2
	}
	if d > c.opts.BackoffMax {
		d = c.opts.BackoffMax
	}
	c.rmu.Lock()
	j := time.Duration(c.rnd.Int63n(int64(d)/2 + 1))
	c.rmu.Unlock()
	return d/2 + j
}

// sleep waits d, or less when ctx ends first (false then).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// retryable: the answers after which the same request goes to the next node: 503 (no
// leader, no quorum, deadline, load, shutdown), and a 502 or 504 that is not idemd's (a
// load balancer in front of a node that is down). Never a replay: a stored 503 is an
// answer.
func retryable(a *answer, e *Error) bool {
	if isReplay(a) {
		return false
	}
	switch a.status {
	case http.StatusServiceUnavailable:
		return true
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return e.Code == ""
	}
	return false
}

// do sends one request (the same bytes on every try: same key, same attempt id, same
// token) until a node answers with something other than a connection failure or a 503,
// or the call's deadline. After a failure it moves to the next node and waits a backoff
// (and a 503's Retry-After at least). Every idemd operation is safe to repeat that way
// (docs/contract.md, "Failure semantics").
func (c *Client) do(ctx context.Context, op, method, path, key string, body []byte) (*answer, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	var last *Error
	for try := 0; ; try++ {
		cur := c.cur.Load()
		node := c.nodes[cur%uint32(len(c.nodes))]
		a, err := c.attempt(ctx, method, node, path, key, body)
		var wait time.Duration
		if err != nil && ctx.Err() != nil {
			// The call's deadline passed (or its context ended) during the attempt: not
			// the node's fault, so it stays the one to try first.
			if last == nil {
				last = &Error{Op: op, Code: CodeUnavailable, Node: node, Err: err}
			}
			return nil, unavailable(ctx, last)
		}
		if err != nil {
			last = &Error{Op: op, Code: CodeUnavailable, Node: node, Message: "no answer", Err: err}
		} else {
			e := answerError(op, node, a.status, a.header, a.body)
			if !retryable(a, e) {
				return a, nil
			}
			last = e
			wait = e.RetryAfter
		}
		c.cur.CompareAndSwap(cur, cur+1) // unless another call moved on already
		if b := c.backoff(try); b > wait {
			wait = b
		}
		dl, _ := ctx.Deadline()
		if ctx.Err() != nil || time.Until(dl) < wait || !sleep(ctx, wait) {
			return nil, unavailable(ctx, last)
		}
	}
}

// unavailable: the error of a call whose deadline passed, or would pass before the next
// try (or whose context ended), without an answer other than failures: the last failure,
// typed unavailable, its cause wrapped with the context's error.
func unavailable(ctx context.Context, last *Error) *Error {
	e := *last
	e.Code = CodeUnavailable
	ctxErr := ctx.Err()
	if ctxErr == nil {
		ctxErr = context.DeadlineExceeded
	}
	if e.Err != nil && !errors.Is(e.Err, ctxErr) {
		e.Err = fmt.Errorf("%w (last failure: %v)", ctxErr, e.Err)
	} else if e.Err == nil {
		e.Err = ctxErr
	}
	return &e
}

// attempt: one request to one node, its answer read whole, within an attempt's share of
// the call's time.
func (c *Client) attempt(ctx context.Context, method, node, path, key string, body []byte) (*answer, error) {
	actx, cancel := context.WithTimeout(ctx, c.attemptTimeout(ctx))
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, method, node+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxAnswerBytes {
		return nil, fmt.Errorf("answer larger than %d bytes", maxAnswerBytes)
	}
	return &answer{status: resp.StatusCode, header: resp.Header, body: b, node: node}, nil
}
