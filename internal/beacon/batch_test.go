package beacon

import (
	"sync"
	"testing"
)

// TestBatcherAddAgain adds an election's heartbeat again to a batch that is already full,
// as a heartbeat retried while its batch waits to be sent does: the batch stays full, with
// the newer key, and the process does not panic on a second close of full.
func TestBatcherAddAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		want      int
		elections []string
	}{
		{"one_key_twice", 1, []string{"a.0", "a.0"}},
		{"again_after_the_last_key", 2, []string{"a.0", "a.1", "a.0"}},
		{"again_before_the_last_key", 2, []string{"a.0", "a.0", "a.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			// Go runs nothing: the batch is never sent, so what Add did is all there is.
			bt := &Batcher[int]{Mu: &mu, Send: func(*Batch[int]) {}, Go: func(func()) {}}
			var batch *Batch[int]
			mu.Lock()
			for i, e := range tc.elections {
				batch = bt.Add(7, e, i, func() int { return tc.want })
			}
			mu.Unlock()
			select {
			case <-batch.full:
			default:
				t.Fatalf("the batch holds %d of %d keys but is not full", len(batch.Keys), tc.want)
			}
			last := len(tc.elections) - 1
			if got := batch.Keys[tc.elections[last]]; got != last {
				t.Errorf("key of %s = %d, want the newer %d", tc.elections[last], got, last)
			}
		})
	}
}
