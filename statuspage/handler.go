// Package statuspage serves a live status page of the elections: the leader_status handler and the admin API's /leader/status.
package statuspage

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the `leader_status` HTTP handler: a read-only page that shows every election
// this instance takes part in — the leader with its fencing token and how long it has led,
// every candidate with its role, priority, hold-off and health, whether this instance
// reaches the store, the failsafe state, and a timeline of the terms with the leaderless
// gaps between them. It updates itself within a second of a change (Server-Sent Events from
// this instance) and works without scripts as a plain page that reloads itself.
//
// The page names every candidate's advertise URL: mount it behind authentication, as the
// metrics handler is. It answers GET and HEAD only; the resign and transfer buttons are on
// the admin API's copy of the page (/leader/status), never here.
//
// Besides the page, the handler answers at the same path:
//
//	?format=json   the page's data as JSON
//	?format=self   this instance's own view of itself, which its peers' pages ask for
//	?events        the live part of the page as Server-Sent Events
//
// For every other candidate the page shows what that candidate itself says of its
// failsafe state and of its link to the store: the page asks the candidate's own page, at
// its advertise URL and this page's path (?format=self), at most every 2 seconds with a
// timeout of 1 second, and shows a candidate that does not answer as unreachable. Let
// the fleet's own addresses through whatever authentication is in front of the page.
type Handler struct {
	// Title heads the page. Default: "caddy-leader status".
	Title string `json:"title,omitempty"`
	// Elections limits the page to the elections named here. Default: every election this
	// instance takes part in.
	Elections []string `json:"elections,omitempty"`
	// AdminLink, when set, is the URL of this instance's admin API page
	// (`http://<admin address>/leader/status`), which the page links to. Caddy's admin
	// endpoint turns away a browser that names no origin it accepts, so the link works when
	// the admin endpoint's `origins` list this page's origin: a browser following it sends
	// this page's origin as the Referer. Default: no link.
	AdminLink string `json:"admin_link,omitempty"`

	page *page
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.leader_status",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision implements caddy.Provisioner.
func (h *Handler) Provision(ctx caddy.Context) error {
	if h.Title == "" {
		h.Title = defaultTitle
	}
	for i, name := range h.Elections {
		if name == "" {
			return fmt.Errorf("elections[%d]: an election name must not be empty", i)
		}
	}
	// The event streams end with this configuration: a reload must not wait on them.
	if h.AdminLink != "" {
		if u, err := url.Parse(h.AdminLink); err != nil || u.Scheme == "" || u.Host == "" {
			return fmt.Errorf("admin_link: %q is not an absolute URL", h.AdminLink)
		}
	}
	app, err := ctx.AppIfConfigured("leader")
	if err != nil {
		return fmt.Errorf("the status page shows the leader app's elections, and the config has none (the leader global option): %v", err)
	}
	src, ok := app.(electionSource)
	if !ok {
		return fmt.Errorf("the leader app is a %T, which does not list its elections", app)
	}
	h.page = &page{title: h.Title, source: func() electionSource { return src }, only: h.Elections, adminLink: h.AdminLink, done: ctx.Done(),
		kept: new(keptHistory), candidates: new(keptCandidates), peers: newPeers()}
	return nil
}

// defaultTitle heads the page unless configured otherwise.
const defaultTitle = "caddy-leader status"

// ServeHTTP implements caddyhttp.MiddlewareHandler. It never calls next: the page is a
// response of its own.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, errors.New("the status page is read-only: use GET"))
	}
	return h.page.serve(w, r)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
