package kubebackend

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyleader/caddy-leader/elector"
)

// Every object this store writes is a coordination.k8s.io/v1 Lease in one namespace, told
// apart by labels (selectable) and annotations (free text):
//
//	<prefix>lease-<id>              a candidate's lease (Grant); Renew rewrites it
//	<prefix><election>-<hash>       the election: holder, token, value, job records (jobs.go)
//	<prefix><election>-<hash>-intent, -history, -ack-<token>, -c-<hash of id>
//	<prefix><group>-<hash>-beacon-<id>  lease <id>'s heartbeats in a group (beacon.go)
//
// An election name may hold any character but white space and a slash, and object names
// are lower-case DNS names, so the name carries a readable part and a hash of the whole.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "caddy-leader"
	labelKind      = "caddy-leader.io/kind"
	labelElection  = "caddy-leader.io/election" // hash of the election name
	labelLease     = "caddy-leader.io/lease"    // hex id of the lease a key is bound to
	labelGroup     = "caddy-leader.io/group"    // hash of the group of an election or a beacon
	// labelExpires marks the objects that expire when nobody rewrites them for their
	// leaseDurationSeconds: leases, acknowledgements and intents (see reaper.go).
	labelExpires = "caddy-leader.io/expires"

	annElection = "caddy-leader.io/election"
	annValue    = "caddy-leader.io/value" // base64 of the opaque value
	annToken    = "caddy-leader.io/token"
	annID       = "caddy-leader.io/candidate"
	annHistory  = "caddy-leader.io/history"  // JSON array of base64 entries
	annWhy      = "caddy-leader.io/why"      // why an acknowledged term ended
	annGroup    = "caddy-leader.io/group"    // the group a beacon is for
	annReleased = "caddy-leader.io/released" // the token of the term that released an election object last
	// A beacon's (see beacon.go): the key versions Expires are clearing (JSON, election
	// -> resourceVersion), and the revision of the holder's last beacon, set by an
	// Expire's write only (0: none).
	annExpiring   = "caddy-leader.io/expiring"
	annLastBeacon = "caddy-leader.io/last-beacon"

	kindLease     = "lease"
	kindElection  = "election"
	kindIntent    = "intent"
	kindHistory   = "history"
	kindAck       = "ack"
	kindCandidate = "candidate"
	kindBeacon    = "beacon"
)

// hash is a short digest that fits a label value and an object name.
func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:5])
}

// readable keeps the characters of s that may appear in an object name.
func readable(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
		if b.Len() >= 40 {
			break
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

func (b *Backend) electionName(election string) string {
	r := readable(election)
	if r != "" {
		r += "-"
	}
	return b.cfg.Prefix + r + hash(election)
}

func (b *Backend) intentName(election string) string { return b.electionName(election) + "-intent" }

func (b *Backend) historyName(election string) string {
	return b.electionName(election) + "-history"
}

func (b *Backend) ackName(election string, token int64) string {
	return b.electionName(election) + "-ack-" + strconv.FormatInt(token, 10)
}

func (b *Backend) candidateName(election, id string) string {
	return b.electionName(election) + "-c-" + hash(id)
}

func (b *Backend) leaseName(id elector.LeaseID) string {
	return b.cfg.Prefix + "lease-" + leaseHex(id)
}

func leaseHex(id elector.LeaseID) string { return fmt.Sprintf("%016x", uint64(id)) }

// leaseID parses a name made by leaseName; ok is false for anything else (an operator's
// holderIdentity, say).
func (b *Backend) leaseID(name string) (elector.LeaseID, bool) {
	h, ok := strings.CutPrefix(name, b.cfg.Prefix+"lease-")
	if !ok || len(h) != 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(h, 16, 64)
	if err != nil || v == 0 || v > 1<<63-1 {
		return 0, false
	}
	return elector.LeaseID(v), true
}

// labels are the labels of an object of kind, of election if it is not "".
func labels(kind, election string, expires bool) map[string]string {
	l := map[string]string{labelManagedBy: managedBy, labelKind: kind}
	if election != "" {
		l[labelElection] = hash(election)
	}
	if expires {
		l[labelExpires] = "true"
	}
	return l
}
