package statuspage

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(AdminPage{})
}

// AdminPage is the `admin.api.leader_status` module: the status page at the admin API's
// /leader/status, with a button to resign the leadership of each election and one to
// transfer it to each candidate that may lead. The buttons post to the admin API's
// /leader/<election>/resign and /leader/<election>/transfer; the admin listener's own
// access rules (its address, origins, remote admin) apply to the page as to them.
//
// Caddy loads admin API modules on its own; there is nothing to configure.
type AdminPage struct{}

// CaddyModule returns the Caddy module information.
func (AdminPage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.leader_status",
		New: func() caddy.Module { return new(AdminPage) },
	}
}

// adminPage lives as long as the process: admin modules are never cleaned up, so it finds
// the leader app of whichever config runs when it is asked.
var adminPage = &page{title: defaultTitle + " (admin)", admin: true, kept: new(keptHistory),
	candidates: new(keptCandidates), peers: newPeers(), source: func() electionSource {
		app, err := caddy.ActiveContext().AppIfConfigured("leader")
		if err != nil {
			return nil
		}
		src, _ := app.(electionSource)
		return src
	}}

// Routes implements caddy.AdminRouter. The pattern is exact: /leader/status/... stays with
// admin.api.leader, so an election named "status" keeps its endpoints there.
func (AdminPage) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/leader/status", Handler: caddy.AdminHandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("use GET")}
		}
		return adminPage.serve(w, r)
	})}}
}

// Interface guards
var (
	_ caddy.AdminRouter = AdminPage{}
)
