package elector

import (
	"context"
	"time"
)

// diagnoseTimeout bounds a diagnosis.
const diagnoseTimeout = time.Second

// Diagnoser is implemented by a Backend that can say more about a failed request than its
// error does: which endpoint it dialled and what the dial met ("connection refused", a
// timeout), where the error says only "context deadline exceeded". The candidate asks it
// only when it logs a failure, so it may take a moment (a dial per endpoint).
type Diagnoser interface {
	// Diagnose returns err with the cause it finds added, or err itself.
	Diagnose(ctx context.Context, err error) error
}

// diagnose is the backend's Diagnose, or err as it is.
func (c *Candidate) diagnose(err error) error {
	d, ok := c.cfg.Backend.(Diagnoser)
	if !ok {
		return err
	}
	// Short: it holds up the failed request's retry.
	ctx, cancel := context.WithTimeout(context.Background(), min(c.requestTimeout, diagnoseTimeout))
	defer cancel()
	return d.Diagnose(ctx, err)
}
