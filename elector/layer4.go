package elector

// SetLayer4Address sets the address (host:port) at which peers reach this candidate's
// layer-4 services of the election, announced with the candidate (CandidateInfo.Layer4) so
// that a follower can hand a connection to the leader. An empty address announces none. A
// change is announced with the campaign loop's next pass, which it asks for at once.
func (e *Election) SetLayer4Address(addr string) {
	if old := e.layer4.Load(); old != nil && *old == addr {
		return
	}
	e.layer4.Store(&addr)
	e.kick()
}

// layer4Address is the address SetLayer4Address set, or "".
func (e *Election) layer4Address() string {
	if p := e.layer4.Load(); p != nil {
		return *p
	}
	return ""
}
