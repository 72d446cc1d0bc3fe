package electortest

import "github.com/caddyleader/caddy-leader/elector"

// Sample is one member's admission as one read of Election.Check saw it.
type Sample struct {
	Leading bool
	Token   int64
}

// SampleOf reads e once.
func SampleOf(e *elector.Election) Sample {
	t, ok := e.Check()
	return Sample{Leading: ok, Token: t.Token}
}

// Overlapped reports whether two passes of reads over the same members, each pass reading
// them in order and the second begun after the first ended, prove that two members
// admitted at one moment. A pass alone proves nothing: a watchdog descheduled between two
// reads (a loaded machine, the race detector) sees the one member before a handover and
// the other after it. A member that admitted under one token at both of its reads admitted
// all along between them (a term that stops admitting never starts again), and every read
// of another member between those two that admitted is then a double admission.
func Overlapped(first, second []Sample) bool {
	for i := range first {
		if !first[i].Leading || !second[i].Leading || first[i].Token != second[i].Token {
			continue
		}
		// Between member i's reads: the first pass's reads after it, the second's before.
		for j := i + 1; j < len(first); j++ {
			if first[j].Leading {
				return true
			}
		}
		for j := range i {
			if second[j].Leading {
				return true
			}
		}
	}
	return false
}
