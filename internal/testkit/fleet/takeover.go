package fleet

import "time"

// TimeTakeover asks each of candidates in turn whether it leads, pausing gap between
// rounds (none if 0), until one does or within has passed since from (the moment of the
// fault). It returns the one that leads, how long after from it was seen leading (or
// how long it looked), and whether one led.
func TimeTakeover[M any](from time.Time, within, gap time.Duration, candidates []M, leads func(M) bool) (M, time.Duration, bool) {
	for {
		for _, c := range candidates {
			if leads(c) {
				return c, time.Since(from), true
			}
		}
		if took := time.Since(from); took > within {
			var none M
			return none, took, false
		}
		if gap > 0 {
			time.Sleep(gap)
		}
	}
}
