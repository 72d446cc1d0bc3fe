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
//	<election>/c                      a candidate's announcement was written or deleted
//	                                  (its lease's too: the delete cascades)
//
// Election names hold no slash. A payload without one is an election name alone, as the
// triggers of earlier versions sent for every change of a key or an intent: it wakes both
// (those versions sent nothing for the candidates). A kind this version does not know
// wakes every watch of the election.
// Anyone who can connect may NOTIFY on any channel, and the fencing token and revisions a
// payload names are no secret, so a notification is only ever a reason to look: the
// watch reads its rows and reports what it finds, never what the payload says (an
// earlier version reported a delete's vacancy from the payload alone, and a forged one
// made a live leader end its term and acknowledge it). What a look may cost is bounded
// too (see notificationReads).

// topic is what a watch follows: the key of an election, its intents or its candidates.
type topic struct {
	election string
	kind     topicKind
}

type topicKind int

const (
	keyTopic topicKind = iota
	intentsTopic
	candidatesTopic
)

// parseNotice returns the topics a notification's payload is about.
func parseNotice(payload string) []topic {
	election, rest, tagged := strings.Cut(payload, "/")
	key, intents := topic{election, keyTopic}, topic{election, intentsTopic}
	if !tagged {
		return []topic{key, intents}
	}
	kind, _, _ := strings.Cut(rest, "/")
	switch kind {
	case "k", "d":
		return []topic{key}
	case "i":
		return []topic{intents}
	case "c":
		return []topic{{election, candidatesTopic}}
	}
	return []topic{key, intents, {election, candidatesTopic}} // a kind from a later version
}
