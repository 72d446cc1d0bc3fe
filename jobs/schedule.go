package jobs

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// A Schedule gives a job's slots: the times at which it is due. Every instance computes
// the same slots from the same schedule, whenever it started, so a slot names one run
// across the fleet.
type Schedule interface {
	// Next returns the first slot strictly after t.
	Next(t time.Time) time.Time
	// String is the schedule as configured, for status and logs.
	String() string
}

// Every returns the schedule whose slots are the multiples of interval since the Unix
// epoch (UTC): `every 30s` is due at :00 and :30 of every minute on every instance.
// interval is at least a millisecond.
func Every(interval time.Duration) Schedule { return every(interval) }

type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := time.Duration(e)
	return time.Unix(0, 0).Add(t.Sub(time.Unix(0, 0)).Truncate(d) + d)
}

func (e every) String() string { return "every " + time.Duration(e).String() }

// cronSchedule is a cron expression evaluated in a time zone.
type cronSchedule struct {
	spec string
	s    cron.Schedule
	loc  *time.Location
}

// cronParser reads the five classic fields (minute, hour, day of month, month, day of
// week) and the descriptors (@hourly, @daily, @weekly, @monthly, @yearly), as crontab(5).
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Cron returns the schedule of the cron expression spec (five fields, or a descriptor
// such as @daily), evaluated in loc (UTC if nil): `0 3 * * *` in Europe/Berlin is due at
// 03:00 Berlin time, whatever the machine's zone. Time-zone prefixes inside spec
// (CRON_TZ=) are refused: the zone is given apart.
func Cron(spec string, loc *time.Location) (Schedule, error) {
	if strings.Contains(spec, "TZ=") {
		return nil, fmt.Errorf("cron expression %q: give the time zone apart, not as TZ= in the expression", spec)
	}
	if strings.HasPrefix(strings.TrimSpace(spec), "@every") {
		return nil, fmt.Errorf("cron expression %q: use `every <duration>` instead of @every", spec)
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("cron expression %q: %v", spec, err)
	}
	if loc == nil {
		loc = time.UTC
	}
	return cronSchedule{spec: spec, s: s, loc: loc}, nil
}

func (c cronSchedule) Next(t time.Time) time.Time { return c.s.Next(t.In(c.loc)) }

func (c cronSchedule) String() string {
	if c.loc == time.UTC {
		return "cron " + c.spec
	}
	return "cron " + c.spec + " " + c.loc.String()
}
