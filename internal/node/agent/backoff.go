package agent

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// backoff is capped exponential backoff with full jitter.
type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max, cur: min} }

func (b *backoff) reset() { b.cur = b.min }

// next returns the next delay: uniform in [cur/2, cur), then doubles cur.
func (b *backoff) next() time.Duration {
	d := b.cur/2 + jitter(b.cur/2) + b.cur/4
	b.cur = min(b.cur*2, b.max)
	return max(d, time.Millisecond)
}

// wait sleeps for the next delay, or for at least floor (a Retry-After).
func (b *backoff) wait(ctx context.Context, floor time.Duration) error {
	d := max(b.next(), floor)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryAfter extracts a server-requested delay from err.
func retryAfter(err error) time.Duration {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.RetryAfter
	}
	return 0
}

// sleepUntil sleeps until at (by the now clock) or ctx ends.
func sleepUntil(ctx context.Context, now func() time.Time, at time.Time) error {
	d := at.Sub(now())
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// leafCert parses the first certificate of a PEM bundle.
func leafCert(certPEM []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}
