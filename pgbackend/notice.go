package pgbackend

import "strings"

// The triggers' notifications name what changed, so that each reaches only the watches
// it concerns:
//
//	<election>/k                      the key was written (insert or update)
//	<election>/d/<token>/<rev>/<at>   the key of term token, last written at rev, was
//	                                  deleted; at is a revision from <prefix>next() taken
//	                                  in the deleting transaction
//	<election>/i                      an intent was written or deleted
//
// Election names hold no slash. A payload without one is an election name alone, as the
// triggers of earlier versions sent for every change of a key or an intent: it wakes both.
// Anyone who can connect may NOTIFY on any channel, and the fencing token and revisions a
// payload names are no secret, so a notification is only ever a reason to look: the
// watch reads the key and reports what it finds, never what the payload says (an earlier
// version reported a delete's vacancy from the payload alone, and a forged one made a
// live leader end its term and acknowledge it). What a look may cost is bounded too (see
// notificationReads).

// topic is what a watch follows: the key of an election, or its intents.
type topic struct {
	election string
	intents  bool
}

// parseNotice returns the topics a notification's payload is about.
func parseNotice(payload string) []topic {
	election, rest, tagged := strings.Cut(payload, "/")
	key, intents := topic{election: election}, topic{election: election, intents: true}
	if !tagged {
		return []topic{key, intents}
	}
	kind, _, _ := strings.Cut(rest, "/")
	switch kind {
	case "k", "d":
		return []topic{key}
	case "i":
		return []topic{intents}
	}
	return []topic{key, intents} // a kind from a later version: look at both
}
