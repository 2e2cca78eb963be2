// Package idem is a client of idemd's HTTP JSON API (docs/http-api.md): run a piece of
// business logic at most once per idempotency key, across every process of a service,
// against a three-node idemd cluster.
//
// Client.Run is the whole protocol in one call, as libidem's idem_run: claim the key, run
// the function while a goroutine renews the lease, then complete with the function's
// response (or release it, or quarantine it as unknown, by what the function returned);
// a retry gets the stored response replayed. Middleware puts net/http handlers behind
// idemd by route. Claim, Complete, Release, Renew and Get are the single calls.
//
// Every call retries connection failures and 503s with the same request (same key, same
// attempt id, same token), moving to the next node and backing off (a 503's Retry-After at
// least), until its context's deadline (Options.Timeout when it has none): every idemd
// operation is safe to repeat, so a retry after an ambiguous failure never runs anything
// twice, and a claim whose answer was lost gets its own lease back. Errors are *Error,
// typed by the answer's JSON code: test them with errors.Is against ErrMismatch,
// ErrInProgress, ErrUnavailable and the other sentinels.
//
// The package uses the standard library only.
package idem
