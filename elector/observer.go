package elector

import (
	"errors"
	"time"

	"go.uber.org/zap"
)

// Observer is told what happens in a candidate's elections, for metrics and events. Its
// methods are called synchronously, some with an election's lock held: they must return
// quickly and must not call back into the election.
type Observer interface {
	// TermChanged reports that e published next after prev.
	TermChanged(e *Election, prev, next *Term)
	// StoreFailed reports a failed request to the store; op is grant, renew, campaign
	// or release.
	StoreFailed(op string, err error)
}

// observerBox lets the observer be swapped atomically (a new config brings a new one).
type observerBox struct{ Observer }

// SetObserver replaces the candidate's observer; nil removes it.
func (c *Candidate) SetObserver(o Observer) {
	c.observer.Store(&observerBox{o})
}

func (c *Candidate) observe() Observer {
	if b := c.observer.Load(); b != nil && b.Observer != nil {
		return b.Observer
	}
	return nil
}

// storeFailed logs a failed store request (once per outage) and tells the observer. A store
// that went back in time costs the lease at once, whichever request noticed it: everything
// it confirmed before, the lease deadline included, belongs to a history it no longer has.
func (c *Candidate) storeFailed(op string, err error) {
	if errors.Is(err, ErrStoreRewound) {
		c.mu.Lock()
		l := c.current
		c.mu.Unlock()
		if l != nil {
			c.log().Error("the store went back in time: giving up the lease, which stops admission, and campaigning anew",
				zap.String("self", c.cfg.ID), zap.String("op", op), zap.Error(err))
			l.rewound.Store(true)
			l.giveUp()
		}
	}
	c.failsafeTrouble(op, err)
	c.trouble.failed(c.log(), op, err, c.diagnose)
	if o := c.observe(); o != nil {
		o.StoreFailed(op, err)
	}
}

// ContactObserver is an Observer that also wants to know each time the store confirms the
// candidate's lease (a grant or a renewal), so that it can tell the store came back after
// StoreFailed. StoreContacted is called synchronously on every confirmation (every TTL/3
// while all is well): it must return quickly.
type ContactObserver interface {
	Observer
	StoreContacted()
}

// storeContacted records a confirmed lease: it ends a logged outage and tells the observer.
func (c *Candidate) storeContacted() {
	c.failsafeContact()
	c.trouble.succeeded(c.log())
	c.lastContact.Store(time.Now().UnixNano())
	if o, ok := c.observe().(ContactObserver); ok {
		o.StoreContacted()
	}
}
