package elector

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

// storeFailed logs a failed store request (once per outage) and tells the observer.
func (c *Candidate) storeFailed(op string, err error) {
	c.trouble.failed(c.log(), op, err)
	if o := c.observe(); o != nil {
		o.StoreFailed(op, err)
	}
}
