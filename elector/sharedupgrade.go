package elector

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"
)

// An instance of an older release announces itself in each shard's own registry and
// never in the set's shared one, so the two kinds do not see each other: each places the
// set among its own kind. No key gets two owners (every claim is still the shard key's
// compare-and-swap, and every term still proves its predecessor stopped), but placement
// is split until the fleet is upgraded. Each instance looks, now and then, for
// candidates in the registry of the set's first shard that are not in the shared one,
// and says so.

// olderEvery is how often a set looks for instances of an older release.
const olderEvery = time.Minute

// watchForOlder looks for instances of an older release in the set while ctx lasts,
// logging a warning whenever the ones it finds change.
func (r *sharedRegistry) watchForOlder(ctx context.Context) {
	var warned []string
	t := time.NewTimer(max(r.c.cfg.TTL, 2*time.Second)) // once the fleet has announced itself
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(olderEvery)
		older, err := r.older(ctx)
		if err != nil || slices.Equal(older, warned) {
			continue
		}
		warned = older
		if len(older) > 0 {
			r.c.log().Warn("instances of an older release run this shard set: they announce themselves per shard and this release per set, so each kind places the set among its own until every instance is upgraded (keys keep one owner each; see docs/shards.md, Upgrades)",
				zap.String("set", r.group), zap.Strings("older_instances", older))
		}
	}
}

// older lists the candidates that the registry of the set's shard 0 lists and the shared
// registry does not.
func (r *sharedRegistry) older(ctx context.Context) ([]string, error) {
	rctx, cancel := context.WithTimeout(ctx, r.c.requestTimeout)
	defer cancel()
	own, err := r.c.cfg.Backend.Candidates(rctx, r.group+".0")
	if err != nil {
		return nil, err
	}
	shared, err := r.fresh.get(ctx)
	if err != nil {
		return nil, err
	}
	var older []string
	for _, c := range own {
		if !slices.ContainsFunc(shared, func(s sharedEntry) bool { return s.ID == c.ID }) {
			older = append(older, c.ID)
		}
	}
	return older, nil
}
