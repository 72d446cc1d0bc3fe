package electortest

import "testing"

func TestOverlapped(t *testing.T) {
	lead := func(token int64) Sample { return Sample{Leading: true, Token: token} }
	idle := Sample{}
	cases := []struct {
		name          string
		first, second []Sample
		want          bool
	}{
		{"one leader", []Sample{lead(5), idle, idle}, []Sample{lead(5), idle, idle}, false},
		{"a handover between the reads proves nothing", []Sample{lead(5), idle}, []Sample{idle, lead(7)}, false},
		{"a handover the other way between two passes", []Sample{idle, lead(5)}, []Sample{lead(7), idle}, false},
		// Member 0 admitted at both reads under one token; member 1 was read in between.
		{"a later member admits between the reads", []Sample{lead(5), lead(7)}, []Sample{lead(5), idle}, true},
		{"an earlier member admits between the reads", []Sample{idle, lead(5)}, []Sample{lead(7), lead(5)}, true},
		{"a new term of the same member is no bracket", []Sample{lead(5), lead(7)}, []Sample{lead(9), idle}, false},
		{"both admit at both reads", []Sample{lead(5), lead(7)}, []Sample{lead(5), lead(7)}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Overlapped(tc.first, tc.second); got != tc.want {
				t.Errorf("Overlapped(%v, %v) = %v, want %v", tc.first, tc.second, got, tc.want)
			}
		})
	}
}
