// Package jobs runs leader-only scheduled jobs: once per slot across the fleet, each run
// under the term of the election (or shard) that owns it, fenced by that term's token, with
// the slot last started and finished recorded in the store.
package jobs
