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
//	<group>/b                         a lease's beacon was written, for the keys it holds
//	                                  in the group's elections (<group>.<n>; beacon.go)
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

// topic is what a watch follows: the key of an election, its intents or its candidates;
// or those of every election of a group (election is then the group's name), which one
// read of the group serves (groupwatch.go).
type topic struct {
	election string
	kind     topicKind
}

type topicKind int

const (
	keyTopic topicKind = iota
	intentsTopic
	candidatesTopic
	groupKeysTopic
	groupIntentsTopic
	groupCandidatesTopic
)

// groupTopic returns the topic of t's group that t's notifications wake too, if t is an
// election's and its name has a group (<group>.<n>).
func groupTopic(t topic) (topic, bool) {
	i := strings.LastIndexByte(t.election, '.')
	if i < 0 || t.kind > candidatesTopic {
		return topic{}, false
	}
	return topic{t.election[:i], t.kind + groupKeysTopic}, true
}

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
	case "b":
		return []topic{{election, groupKeysTopic}}
	}
	return []topic{key, intents, {election, candidatesTopic}} // a kind from a later version
}
