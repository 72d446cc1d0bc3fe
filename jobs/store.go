package jobs

import "context"

// Store is what a job runner needs from a coordination store, beside the election's
// elector.Backend: one record per job and election, written only by the holder of the
// election's key. The elector's stores implement it (etcd, PostgreSQL, Kubernetes, and
// the in-memory store of elector/electortest); the conformance suite in jobs/jobstest
// checks every rule below.
//
// Rules:
//   - It honours ctx as elector.Backend does: a request that ctx ended may or may not have
//     taken effect, and the runner reads the record again rather than assume either.
//   - PutJobRecord writes if and only if the election's key exists with fencing token
//     token at the moment of the write, atomically with that check: a deposed holder, a
//     holder whose key an operator deleted, or one whose lease expired can never write,
//     however late its request arrives. That is what makes a record "under the term that
//     ran it": the runner reads the record once per term, and is its only writer while
//     the term lasts.
//   - A record outlives every lease and term, and every restart of its writers; it is
//     gone only when an operator deletes it.
//   - JobRecord is linearizable: it returns the value of the latest PutJobRecord that
//     reported true before JobRecord was called (from any client), or a later one.
//   - The records of different jobs, and of one job in different elections (each shard of
//     a shard set is an election), are independent.
type Store interface {
	// JobRecord returns the record of job in election, nil when there is none.
	JobRecord(ctx context.Context, election, job string) ([]byte, error)
	// PutJobRecord replaces the record of job in election with value if election's key is
	// held under token, and reports whether it did. It returns false and no error when
	// the key is gone or holds another token.
	PutJobRecord(ctx context.Context, election, job string, token int64, value []byte) (bool, error)
}
