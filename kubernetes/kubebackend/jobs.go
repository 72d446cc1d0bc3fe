package kubebackend

import (
	"context"
	"encoding/base64"
	"fmt"

	coordv1 "k8s.io/api/coordination/v1"

	"github.com/caddyleader/caddy-leader/jobs"
)

// A job's record in an election is an annotation of the election's own object,
// caddy-leader.io/job-<job, readable>-<hash of job>, holding the record in base64. The API
// server has no transaction over two objects: only a write of the object that holds the
// term can be conditional on the term. The put reads the object, checks that it holds the
// token under a lease object that exists (as every read of the key does), and writes it
// back at the resourceVersion it read. Any later term begins with a write of that same
// object (a campaign, after the write that clears the key), so the put lands before it or
// fails with a conflict and reads again. The record stays in the object through every
// term (each write carries the annotations it read) until an operator deletes the object.
//
// Followers see a put as a write of the key by its holder, as they see a heartbeat: it
// makes them wait for the holder's deadline from a later moment, never an earlier one.

// annJobPrefix begins the annotation of each job's record.
const annJobPrefix = "caddy-leader.io/job-"

// jobPutTries bounds the puts of one record that lose to another write of the election
// object (a heartbeat, a watcher clearing a key whose lease is gone); each reads it again.
const jobPutTries = 5

// jobAnnotation is the annotation of job's record: a readable part (annotation names are
// at most 63 characters of a restricted set) and a hash of the whole name.
func jobAnnotation(job string) string {
	r := readable(job)
	if r != "" {
		r += "-"
	}
	return annJobPrefix + r + hash(job)
}

// JobRecord implements jobs.Store with a consistent read of the election object.
func (b *Backend) JobRecord(ctx context.Context, election, job string) ([]byte, error) {
	obj, _, err := b.getNamed(ctx, b.revs.mark(), b.electionName(election))
	if err != nil || obj == nil {
		return nil, err
	}
	enc, ok := obj.Annotations[jobAnnotation(job)]
	if !ok {
		return nil, nil
	}
	value, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: lease %s: annotation %s is not base64: %w", obj.Name, jobAnnotation(job), err)
	}
	return value, nil
}

// PutJobRecord implements jobs.Store: an update of the election object at the
// resourceVersion of the read that found it held under token.
func (b *Backend) PutJobRecord(ctx context.Context, election, job string, token int64, value []byte) (bool, error) {
	return b.updateHeld(ctx, election, token, jobPutTries, func(obj *coordv1.Lease) {
		obj.Annotations[jobAnnotation(job)] = base64.StdEncoding.EncodeToString(value)
	})
}

var _ jobs.Store = (*Backend)(nil)
