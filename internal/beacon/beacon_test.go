package beacon

import "testing"

func TestGroupsOf(t *testing.T) {
	var gs Groups[string]
	rooms := "rooms state"
	gs.Join("rooms", func() *string { return &rooms })
	gs.Join("rooms", func() *string { t.Fatal("a group joined twice was made twice"); return nil })
	for _, tc := range []struct {
		election string
		want     *string
	}{
		{"rooms.7", &rooms},
		{"rooms.", &rooms},
		{"rooms", nil},
		{"tenants.7", nil},
		{"a.rooms.7", nil},
		{"main", nil},
	} {
		t.Run(tc.election, func(t *testing.T) {
			if got := gs.Of(tc.election); got != tc.want {
				t.Fatalf("Of(%q) = %v, want %v", tc.election, got, tc.want)
			}
		})
	}
}

func TestAnswerDecided(t *testing.T) {
	for _, tc := range []struct {
		answer           Answer
		updated, decided bool
	}{
		{Held, true, true},
		{Gone, false, true},
		{Unknown, false, false},
	} {
		updated, decided := tc.answer.Decided()
		if updated != tc.updated || decided != tc.decided {
			t.Errorf("%d.Decided() = %v, %v; want %v, %v", tc.answer, updated, decided, tc.updated, tc.decided)
		}
	}
}
