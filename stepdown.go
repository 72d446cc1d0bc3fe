package caddyleader

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
)

// Defaults of step_down_when_unhealthy.
const (
	DefaultStepDownInterval = 5 * time.Second
	DefaultStepDownTimeout  = 2 * time.Second
	DefaultStepDownFails    = 3
	DefaultStepDownHoldOff  = time.Minute
)

// Events of step_down_when_unhealthy.
const (
	// EventServiceUnhealthy: the local service failed its probe `fails` times in a row;
	// this instance resigned the elections it led and holds off from all of them. Data:
	// self, url, failures, error, hold_off, stepped_down (the elections it led).
	EventServiceUnhealthy = "leader_service_unhealthy"
	// EventServiceHealthy: the probe passed again after EventServiceUnhealthy. Data: self,
	// url, failures. The instance campaigns again once its hold-off ends.
	EventServiceHealthy = "leader_service_healthy"
)

// StepDown makes an instance give up leadership when the service it fronts is unhealthy,
// as keepalived's track_script does: it probes a URL of the local service every interval,
// and after fails failures in a row it resigns every election it leads and stays out of all
// of them (leader or not) for hold_off, renewed while the probe keeps failing. Resigning
// is the same graceful handover as `caddy leader resign --hold-off`: the fleet hears of it
// first, admitted requests drain, then a healthy follower takes over at once.
//
// A probe passes when the URL answers a 2xx status within timeout; redirects are not
// followed. If every instance's service is unhealthy, none leads.
type StepDown struct {
	// URL is probed with GET, such as `http://127.0.0.1:9000/healthz`. Placeholders are
	// expanded when the config loads. Required.
	URL string `json:"url,omitempty"`

	// Interval is the time between two probes. Default: 5s.
	Interval caddy.Duration `json:"interval,omitempty"`

	// Timeout bounds one probe; a probe that takes longer fails. At most interval.
	// Default: 2s, or interval if that is shorter.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Fails is how many probes in a row must fail before this instance steps down.
	// Default: 3.
	Fails int `json:"fails,omitempty"`

	// HoldOff is how long this instance stays out of its elections after the last failed
	// probe. At least interval, so that an instance whose probe keeps failing never
	// campaigns between two probes. Default: 1m.
	HoldOff caddy.Duration `json:"hold_off,omitempty"`
}

// provision expands placeholders and fills in defaults.
func (s *StepDown) provision() {
	s.URL = caddy.NewReplacer().ReplaceKnown(s.URL, "")
	if s.Interval == 0 {
		s.Interval = caddy.Duration(DefaultStepDownInterval)
	}
	if s.Timeout == 0 {
		s.Timeout = min(caddy.Duration(DefaultStepDownTimeout), s.Interval)
	}
	if s.Fails == 0 {
		s.Fails = DefaultStepDownFails
	}
	if s.HoldOff == 0 {
		s.HoldOff = caddy.Duration(DefaultStepDownHoldOff)
	}
}

// check names the first field that is wrong, after provision.
func (s *StepDown) check() error {
	u, err := url.Parse(s.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("step_down_when_unhealthy: url: %q is not an http:// or https:// URL with a host", s.URL)
	case s.Interval < 0:
		return fmt.Errorf("step_down_when_unhealthy: interval: %s is negative", time.Duration(s.Interval))
	case s.Timeout < 0 || s.Timeout > s.Interval:
		return fmt.Errorf("step_down_when_unhealthy: timeout: %s must be positive and at most interval (%s)", time.Duration(s.Timeout), time.Duration(s.Interval))
	case s.Fails < 0:
		return fmt.Errorf("step_down_when_unhealthy: fails: %d is negative", s.Fails)
	case s.HoldOff < s.Interval:
		return fmt.Errorf("step_down_when_unhealthy: hold_off: %s is shorter than interval (%s), so an instance whose probe keeps failing would campaign between probes", time.Duration(s.HoldOff), time.Duration(s.Interval))
	}
	return nil
}

// watchHealth probes the local service until ctx ends (the config is unloaded) and steps
// down from the app's elections when it fails.
func (a *App) watchHealth(ctx context.Context) {
	s := a.StepDown
	client := &http.Client{
		Timeout:       time.Duration(s.Timeout),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	ticker := time.NewTicker(time.Duration(s.Interval))
	defer ticker.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		err := probe(ctx, client, s.URL)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			if failures >= s.Fails {
				a.logger.Info("local service healthy again; campaigning once the hold-off ends",
					zap.String("url", s.URL), zap.Int("failures", failures))
				a.observer.enqueue(EventServiceHealthy, map[string]any{"self": a.InstanceID, "url": s.URL, "failures": failures})
			}
			failures = 0
		default:
			failures++
			if failures >= s.Fails {
				a.stepDown(ctx, failures, err)
			}
		}
	}
}

// stepDown resigns the elections this instance leads and renews the hold-off of all of
// them. It logs and emits an event on the failure that makes the service unhealthy, and
// on each election it leads after that (one won just before the hold-off began).
func (a *App) stepDown(ctx context.Context, failures int, cause error) {
	s := a.StepDown
	var led []string
	for name, e := range a.elections {
		if _, leading := e.Check(); leading {
			led = append(led, name)
		}
	}
	if failures == s.Fails || len(led) > 0 {
		a.logger.Warn("local service unhealthy; stepping down and holding off",
			zap.String("url", s.URL), zap.Int("failures", failures), zap.Error(cause),
			zap.Strings("stepped_down", led), zap.Duration("hold_off", time.Duration(s.HoldOff)))
		a.observer.enqueue(EventServiceUnhealthy, map[string]any{
			"self": a.InstanceID, "url": s.URL, "failures": failures, "error": cause.Error(),
			"hold_off": time.Duration(s.HoldOff).String(), "stepped_down": led,
		})
	}
	for name, e := range a.elections {
		rctx, cancel := context.WithTimeout(ctx, a.candidate.HandoverTimeout())
		if err := e.Resign(rctx, time.Duration(s.HoldOff)); err != nil {
			a.logger.Error("stepping down failed; the lease runs out instead", zap.String("election", name), zap.Error(err))
		}
		cancel()
	}
}

// probe GETs url once: nil for a 2xx answer, else why not.
func probe(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096)) // lets the connection be reused
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// unmarshalStepDown parses the leader option's step_down_when_unhealthy:
//
//	step_down_when_unhealthy <url> {
//		interval <duration>
//		timeout  <duration>
//		fails    <n>
//		hold_off <duration>
//	}
func unmarshalStepDown(d *caddyfile.Dispenser) (*StepDown, error) {
	s := new(StepDown)
	if !d.NextArg() {
		return nil, d.Err("step_down_when_unhealthy: the URL to probe is missing")
	}
	s.URL = d.Val()
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	var timeoutAt position
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch sub := d.Val(); sub {
		case "interval":
			if err := positiveDurationArg(d, &s.Interval, DefaultStepDownInterval); err != nil {
				return nil, err
			}
		case "timeout":
			timeoutAt = at(d)
			if err := positiveDurationArg(d, &s.Timeout, DefaultStepDownTimeout); err != nil {
				return nil, err
			}
		case "hold_off":
			if err := positiveDurationArg(d, &s.HoldOff, DefaultStepDownHoldOff); err != nil {
				return nil, err
			}
		case "fails":
			var v string
			if err := oneArg(d, &v); err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, d.Errf("step_down_when_unhealthy: fails: %q is not a whole number of at least 1", v)
			}
			s.Fails = n
		default:
			return nil, d.Errf("unrecognized step_down_when_unhealthy option %q", sub)
		}
	}
	if interval := cmp.Or(s.Interval, caddy.Duration(DefaultStepDownInterval)); s.Timeout > interval {
		return nil, timeoutAt.errf("step_down_when_unhealthy: timeout: %s is above interval (%s): a probe must end before the next one starts",
			time.Duration(s.Timeout), time.Duration(interval))
	}
	return s, nil
}
