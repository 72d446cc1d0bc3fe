package elector

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// troubleLog logs the store going away and coming back, not every failed retry: at most
// one WARN every 30s, even when one kind of request keeps failing between successes of
// another (a campaign denied while renewals go through), and one INFO when requests
// succeed again after a logged failure.
type troubleLog struct {
	mu       sync.Mutex
	failing  bool
	warned   bool // a WARN was logged since the last success
	failures int
	lastLog  time.Time
}

const troubleRepeat = 30 * time.Second

// failed records a failed request, and logs it when it is time to; explain adds the cause
// the backend finds, only to a failure that is logged (outside the lock: it may dial).
func (t *troubleLog) failed(l *zap.Logger, op string, err error, explain func(error) error) {
	t.mu.Lock()
	t.failures++
	t.failing = true
	failures, log := t.failures, t.lastLog.IsZero() || time.Since(t.lastLog) >= troubleRepeat
	if log {
		t.lastLog = time.Now()
		t.warned = true
	}
	t.mu.Unlock()
	if log {
		l.Warn("store request failing; gated routes fail closed while the lease is not confirmed",
			zap.String("op", op), zap.Int("failures", failures), zap.Error(explain(err)))
	}
}

func (t *troubleLog) succeeded(l *zap.Logger) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failing && t.warned {
		l.Info("store reachable again", zap.Int("failed_requests", t.failures))
	}
	t.failing, t.warned, t.failures = false, false, 0
}
