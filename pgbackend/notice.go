package pgbackend

import (
	"strconv"
	"strings"
)

// The triggers' notifications name what changed, so that each reaches only the watches
// it concerns, and the delete of a key says enough for a watch to report the vacancy
// without reading the key again (one statement less between a release and the
// successor's campaign):
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
// Anyone who can connect may NOTIFY on any channel, so a notification is only ever a
// reason to look: a vacancy it describes is reported only after the very write the watch
// last reported, and what a campaign then finds decides.

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

// vacancy is what a key's delete notification says.
type vacancy struct {
	// token and rev are the deleted row's term and last write.
	token, rev int64
	// at is the vacancy's revision: above rev and every revision read before the delete.
	at int64
}

// notice is what one notification says: whom it concerns and, for a delete, the vacancy.
type notice struct {
	topics  []topic
	vacated *vacancy
}

func parseNotice(payload string) notice {
	election, rest, tagged := strings.Cut(payload, "/")
	key, intents := topic{election, keyTopic}, topic{election, intentsTopic}
	if !tagged {
		return notice{topics: []topic{key, intents}}
	}
	kind, fields, _ := strings.Cut(rest, "/")
	switch kind {
	case "k":
		return notice{topics: []topic{key}}
	case "i":
		return notice{topics: []topic{intents}}
	case "c":
		return notice{topics: []topic{{election, candidatesTopic}}}
	case "d":
		return notice{topics: []topic{key}, vacated: parseVacancy(fields)}
	}
	return notice{topics: []topic{key, intents, {election, candidatesTopic}}} // a kind from a later version
}

// parseVacancy reads "<token>/<rev>/<at>"; nil if it does not hold three numbers with at
// above rev.
func parseVacancy(fields string) *vacancy {
	parts := strings.Split(fields, "/")
	if len(parts) != 3 {
		return nil
	}
	var n [3]int64
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil
		}
		n[i] = v
	}
	if n[2] <= n[1] {
		return nil
	}
	return &vacancy{token: n[0], rev: n[1], at: n[2]}
}
