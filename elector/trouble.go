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

func (t *troubleLog) failed(l *zap.Logger, op string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failures++
	t.failing = true
	if t.lastLog.IsZero() || time.Since(t.lastLog) >= troubleRepeat {
		l.Warn("store request failing; gated routes fail closed while the lease is not confirmed",
			zap.String("op", op), zap.Int("failures", t.failures), zap.Error(err))
		t.lastLog = time.Now()
		t.warned = true
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
