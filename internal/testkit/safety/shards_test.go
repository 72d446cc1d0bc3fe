package safety

import (
	"testing"
	"time"
)

func TestCheckShards(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	// arr is a request of shard admitted by by under token: its gate entered at entered ms,
	// the proxy sent it on 1ms later, and it arrived 1ms after that.
	arr := func(shard int, by string, token int64, entered int) Arrival {
		return Arrival{ReqID: by, ServedBy: by, Token: token, Shard: shard, Entered: ms(entered), Admitted: ms(entered + 1), At: ms(entered + 2)}
	}
	faultAt, loadEnd := ms(100), ms(1000)
	for _, tc := range []struct {
		name                 string
		log                  []Arrival
		double, stale, moved int
		unstamp              int
		// faulted is the instance the fault struck; oldLastAdmit the latest admission,
		// after the fault, of a term at the fault that it served.
		faulted      string
		struck       []int
		oldLastAdmit time.Duration
		checkOld     bool
	}{
		{
			// One store's tokens are shared by every shard: shard 1's term is older than
			// shard 0's, which is no stale arrival, as each shard has its own terms.
			name: "each_shard_has_its_own_terms",
			log:  []Arrival{arr(0, "c0", 7, 10), arr(1, "c1", 3, 20), arr(0, "c0", 7, 30), arr(1, "c1", 3, 40)},
		},
		{
			name:  "a_move_is_counted_per_shard",
			log:   []Arrival{arr(0, "c0", 7, 10), arr(1, "c1", 3, 20), arr(1, "c2", 9, 200), arr(0, "c0", 7, 210)},
			moved: 1,
		},
		{
			name:   "an_old_term_admitting_after_the_new_one_is_double",
			log:    []Arrival{arr(1, "c1", 3, 20), arr(1, "c2", 9, 200), arr(1, "c1", 3, 300)},
			double: 1, stale: 1, moved: 1,
		},
		{
			// c1 owned shard 1 at the fault and hands it over gracefully 2.9 s later (the
			// placement settling): that is no admission of the faulted c0's.
			name:    "a_graceful_move_of_another_instances_shard_is_not_the_faulted_ones",
			log:     []Arrival{arr(0, "c0", 7, 10), arr(1, "c1", 3, 20), arr(0, "c2", 9, 500), arr(1, "c1", 3, 3000), arr(1, "c2", 11, 3010)},
			moved:   2,
			faulted: "c0", oldLastAdmit: 0, checkOld: true,
		},
		{
			name:    "the_faulted_instances_late_admission_counts",
			log:     []Arrival{arr(0, "c0", 7, 10), arr(1, "c1", 3, 20), arr(0, "c0", 7, 2500), arr(0, "c2", 9, 2600)},
			moved:   1,
			faulted: "c0", oldLastAdmit: 2400 * time.Millisecond, checkOld: true,
		},
		{
			name:    "without_a_faulted_instance_every_shard_counts",
			log:     []Arrival{arr(0, "c0", 7, 10), arr(1, "c1", 3, 20), arr(0, "c2", 9, 500), arr(1, "c1", 3, 3000), arr(1, "c2", 11, 3010)},
			moved:   2,
			faulted: "", oldLastAdmit: 2900 * time.Millisecond, checkOld: true,
		},
		{
			// The fault deleted shard 0's key and slowed c0's links: c0 renews shard 1's
			// lease through the slow link and admits until it hands shard 1 over 2.9 s
			// later; only shard 0's term is bound by the fault.
			name:    "a_shard_the_fault_did_not_strike_is_not_bounded",
			log:     []Arrival{arr(0, "c0", 7, 10), arr(1, "c0", 3, 20), arr(0, "c0", 7, 300), arr(0, "c2", 9, 500), arr(1, "c0", 3, 3000), arr(1, "c2", 11, 3010)},
			moved:   2,
			faulted: "c0", struck: []int{0}, oldLastAdmit: 200 * time.Millisecond, checkOld: true,
		},
		{
			name:    "an_arrival_without_a_shard_is_unstamped",
			log:     []Arrival{arr(0, "c0", 7, 10), arr(-1, "c0", 7, 20)},
			unstamp: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := CheckShards(tc.name, nil, tc.log, faultAt, loadEnd, tc.faulted, tc.struck...)
			if rep.Double != tc.double || rep.Stale != tc.stale || rep.ShardsMoved != tc.moved || rep.Unstamp != tc.unstamp || rep.Wrong != 0 {
				t.Errorf("double %d, stale %d, moved %d, unstamped %d, wrong %d; want %d, %d, %d, %d, 0 (problems %q)",
					rep.Double, rep.Stale, rep.ShardsMoved, rep.Unstamp, rep.Wrong, tc.double, tc.stale, tc.moved, tc.unstamp, rep.Problems)
			}
			if tc.checkOld && rep.OldLastAdmit != tc.oldLastAdmit {
				t.Errorf("OldLastAdmit %v, want %v", rep.OldLastAdmit, tc.oldLastAdmit)
			}
			if whole := Check(tc.name, nil, tc.log, 0, faultAt, loadEnd); tc.name == "each_shard_has_its_own_terms" && whole.Stale == 0 {
				t.Errorf("the whole log, checked as one election, shows no stale arrival: the case tells nothing")
			}
		})
	}
}
