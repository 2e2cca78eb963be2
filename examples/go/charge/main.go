// charge: charge a customer at most once per idempotency key, with idem.Client.Run (the
// Go counterpart of examples/claim_run.c).
//
//	charge KEY AMOUNT     (IDEM_TOKEN, and IDEM_HTTP or the quickstart's gateways)
//
// Run it twice with the same key and amount: the first run charges and prints the
// receipt; the second prints the same receipt, replayed, without charging again. Another
// amount under the same key is refused (mismatch). Exit status: 0 charged or replayed,
// 1 another outcome, 2 usage, setup, or a request refused as it stands, 3 nothing ran
// (retry later with the same key), 4 charged but not recorded (do not charge again).
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"idemd.dev/idem"
	"idemd.dev/idem/examples/internal/config"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: charge KEY AMOUNT")
		os.Exit(2)
	}
	key, amount := os.Args[1], os.Args[2]
	c, err := config.Client()
	if err != nil {
		fmt.Fprintln(os.Stderr, "charge:", err)
		os.Exit(2)
	}
	defer c.Close()

	// The request the key stands for: a retry must name the same one (the gateway
	// fingerprints it); another amount under the same key is a mismatch.
	req := idem.Request{Method: "POST", Path: "/charges", Body: map[string]string{"amount": amount},
		Lease: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	res, err := c.Run(ctx, key, req, func(ctx context.Context, token uint64) (*idem.Response, error) {
		// The business: a real one would call the payment provider here, with the fencing
		// token as its own idempotency key. Classify what happened: return
		// idem.Retryable(err) if nothing happened (declined before any side effect), any
		// other error if the outcome is unknown (a timeout after sending).
		fmt.Fprintf(os.Stderr, "charge: charging %s (fencing token %d)\n", amount, token)
		return &idem.Response{Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   []byte(fmt.Sprintf(`{"charged": %q, "fence": %d}`, amount, token))}, nil
	})
	var fe *idem.FinishError
	switch {
	case err == nil && res.Replayed:
		fmt.Printf("replayed, not charged again: %s\n", res.Response.Body)
	case err == nil:
		fmt.Printf("charged: %s\n", res.Response.Body)
	case errors.As(err, &fe):
		fmt.Fprintln(os.Stderr, "charge: charged but not recorded:", err)
		os.Exit(4)
	case errors.Is(err, idem.ErrMismatch):
		fmt.Fprintln(os.Stderr, "charge: this key was used for another amount")
		os.Exit(1)
	case errors.Is(err, idem.ErrInProgress), errors.Is(err, idem.ErrUnavailable):
		fmt.Fprintln(os.Stderr, "charge: nothing ran; retry later with the same key:", err)
		os.Exit(3)
	case errors.Is(err, idem.ErrInvalid), errors.Is(err, idem.ErrUnauthorized):
		fmt.Fprintln(os.Stderr, "charge:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "charge:", err)
		os.Exit(1)
	}
}
