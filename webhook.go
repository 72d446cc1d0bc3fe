package caddyleader

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
)

func init() {
	caddy.RegisterModule(Webhook{})
}

// DefaultWebhookTimeout bounds one webhook delivery.
const DefaultWebhookTimeout = 5 * time.Second

// Webhook is the `leader_webhook` event handler: it POSTs each event it is subscribed to
// as a JSON object to a URL, so that leadership and store trouble reach an alerting or
// chat system without an exec plugin (keepalived's notify scripts, over HTTP). The body is
//
//	{"name": "leader_store_unreachable", "id": "<event uuid>", "origin": "leader",
//	 "timestamp": "<RFC 3339>", "data": {...the event's data...}}
//
// A delivery that fails (no answer within timeout, or a status other than 2xx, redirects
// included) is logged and not retried: the events app runs handlers in the order of the
// events, and a retry would hold up the ones after it.
type Webhook struct {
	// URL receives the POST. Placeholders, such as `{env.ALERT_WEBHOOK}`, are expanded
	// when the config loads. Required.
	URL string `json:"url,omitempty"`

	// Timeout bounds one delivery, from dialling to reading the status. Default: 5s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	client *http.Client
}

// CaddyModule returns the Caddy module information.
func (Webhook) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.leader_webhook",
		New: func() caddy.Module { return new(Webhook) },
	}
}

// Provision implements caddy.Provisioner.
func (h *Webhook) Provision(caddy.Context) error {
	h.URL = caddy.NewReplacer().ReplaceKnown(h.URL, "")
	if h.Timeout == 0 {
		h.Timeout = caddy.Duration(DefaultWebhookTimeout)
	}
	// A redirect would turn the POST into a GET without the event: it is a failed delivery.
	h.client = &http.Client{
		Timeout:       time.Duration(h.Timeout),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return nil
}

// Validate implements caddy.Validator.
func (h *Webhook) Validate() error {
	u, err := url.Parse(h.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("url: %q is not an http:// or https:// URL with a host", h.URL)
	}
	if h.Timeout < 0 {
		return fmt.Errorf("timeout: %s is negative", time.Duration(h.Timeout))
	}
	return nil
}

// webhookBody is what Webhook POSTs.
type webhookBody struct {
	Name      string         `json:"name"`
	ID        string         `json:"id"`
	Origin    string         `json:"origin"`
	Timestamp time.Time      `json:"timestamp"`
	Data      map[string]any `json:"data"`
}

// Handle implements caddyevents.Handler.
func (h *Webhook) Handle(ctx context.Context, e caddy.Event) error {
	origin := ""
	if e.Origin() != nil {
		origin = string(e.Origin().CaddyModule().ID)
	}
	body, err := json.Marshal(webhookBody{e.Name(), e.ID().String(), origin, e.Timestamp(), e.Data})
	if err != nil {
		return fmt.Errorf("leader_webhook: encoding event %s: %v", e.Name(), err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("leader_webhook: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("leader_webhook: delivering event %s: %v", e.Name(), err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("leader_webhook: delivering event %s: %s answered %s", e.Name(), h.URL, resp.Status)
	}
	return nil
}

// UnmarshalCaddyfile sets up the handler from the `events` global option:
//
//	events {
//		on <event> leader_webhook <url> {
//			timeout <duration>
//		}
//	}
func (h *Webhook) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the handler's name
	if !d.NextArg() {
		return d.ArgErr()
	}
	h.URL = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "timeout":
			if !d.NextArg() {
				return d.ArgErr()
			}
			t, err := caddy.ParseDuration(d.Val())
			if err != nil || t <= 0 {
				return d.Errf("leader_webhook: timeout: %q is not a positive duration", d.Val())
			}
			h.Timeout = caddy.Duration(t)
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("leader_webhook: unknown subdirective %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Webhook)(nil)
	_ caddy.Validator       = (*Webhook)(nil)
	_ caddyevents.Handler   = (*Webhook)(nil)
	_ caddyfile.Unmarshaler = (*Webhook)(nil)
)
