package jobs

import (
	"testing"
	"time"
)

func TestSchedules(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	mustCron := func(spec string, loc *time.Location) Schedule {
		s, err := Cron(spec, loc)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name     string
		schedule Schedule
		after    string
		want     string
	}{
		{"every 30s is due on the half minute", Every(30 * time.Second), "2026-11-28T10:00:05Z", "2026-11-28T10:00:30Z"},
		{"a slot is strictly after", Every(30 * time.Second), "2026-11-28T10:00:30Z", "2026-11-28T10:01:00Z"},
		{"every 1s", Every(time.Second), "2026-11-28T10:00:00.999Z", "2026-11-28T10:00:01Z"},
		{"cron in UTC", mustCron("0 3 * * *", nil), "2026-11-28T10:00:00Z", "2026-11-29T03:00:00Z"},
		{"cron in Berlin", mustCron("0 3 * * *", berlin), "2026-11-28T10:00:00Z", "2026-11-29T02:00:00Z"},
		{"a descriptor", mustCron("@hourly", nil), "2026-11-28T10:00:00Z", "2026-11-28T11:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.schedule.Next(at(tc.after)); !got.Equal(at(tc.want)) {
				t.Errorf("%s: Next(%s) = %s, want %s", tc.schedule, tc.after, got.UTC().Format(time.RFC3339Nano), tc.want)
			}
		})
	}
}

func TestCronRefuses(t *testing.T) {
	for _, spec := range []string{"CRON_TZ=Europe/Berlin 0 3 * * *", "@every 5m", "0 3 * *", "61 * * * *", "* * * * * *"} {
		t.Run(spec, func(t *testing.T) {
			if _, err := Cron(spec, nil); err == nil {
				t.Errorf("Cron(%q) accepted", spec)
			}
		})
	}
}

func TestDueSlots(t *testing.T) {
	first := time.Unix(1000, 0)
	hourly, err := Cron("0 * * * *", nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		schedule Schedule
		first    time.Time
		now      time.Time
		n        int
		newest   time.Time
	}{
		{"none yet", Every(time.Second), first, first.Add(-time.Millisecond), 0, time.Time{}},
		{"the first only", Every(time.Second), first, first.Add(999 * time.Millisecond), 1, first},
		{"a day of milliseconds", Every(time.Millisecond), first, first.Add(24 * time.Hour), 86_400_001, first.Add(24 * time.Hour)},
		{"cron, three hours", hourly, time.Unix(3600*10, 0), time.Unix(3600*12+5, 0), 3, time.Unix(3600*12, 0)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, newest := dueSlots(tc.schedule, tc.first, tc.now)
			if n != tc.n || !newest.Equal(tc.newest) {
				t.Errorf("dueSlots = %d, %s; want %d, %s", n, newest, tc.n, tc.newest)
			}
		})
	}
}
