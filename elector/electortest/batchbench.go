package electortest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyleader/caddy-leader/elector"
)

// BenchClaims claims n elections named group.<round>-<i> under one lease of backend and
// releases them again: one request per election (the reference, measured in the same
// run), then in the store's batches (elector.Batcher). It reports the milliseconds each
// half takes for all n. A store's benchmark starts the server and calls it.
func BenchClaims(b *testing.B, backend elector.Backend, group string, n int) {
	ctx := context.Background()
	round := 0
	for _, bc := range []struct {
		name    string
		batcher elector.Batcher
	}{
		{"one_by_one", elector.Batched(struct{ elector.Backend }{backend})}, // hides the store's batches
		{"batched", elector.Batched(backend)},
	} {
		b.Run(fmt.Sprintf("%s/elections=%d", bc.name, n), func(b *testing.B) {
			var claiming, releasing time.Duration
			for range b.N {
				round++
				lease, _, err := backend.Grant(ctx, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				claims := make([]elector.Claim, n)
				for i := range claims {
					name := fmt.Sprintf("%s.%d-%d", group, round, i)
					claims[i] = elector.Claim{Election: name, Value: []byte("holder of " + name)}
				}
				start := time.Now()
				obs, err := bc.batcher.CampaignAll(ctx, claims, lease)
				if err != nil {
					b.Fatal(err)
				}
				claiming += time.Since(start)
				terms := make([]elector.HeldTerm, n)
				for i, o := range obs {
					if o.Holder == nil || o.Holder.Lease != lease {
						b.Fatalf("%s not won: %+v", claims[i].Election, o.Holder)
					}
					terms[i] = elector.HeldTerm{Election: claims[i].Election, Token: o.Holder.Token}
				}
				start = time.Now()
				if err := bc.batcher.ReleaseAll(ctx, terms, lease, "bench"); err != nil {
					b.Fatal(err)
				}
				releasing += time.Since(start)
				if err := backend.Revoke(ctx, lease); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(claiming.Milliseconds())/float64(b.N), "claim-ms")
			b.ReportMetric(float64(releasing.Milliseconds())/float64(b.N), "release-ms")
		})
	}
}
