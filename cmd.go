package caddyleader

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddyleader/caddy-leader/elector"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "leader",
		Usage: "status|shards|history|resign|transfer|jobs [--election <name>] [--address <interface>] [--config <path> [--adapter <name>]]",
		Short: "Shows and steers this instance's leader elections",
		Long: `
Talks to the admin API of the running Caddy instance (the leader endpoints
under /leader/). The admin address comes from --address if given, else from
the --config file, else the default, as for 'caddy reload' and 'caddy stop'.

  caddy leader status [--election <name>] [--json]
  caddy leader shards [<set>] [--json]
  caddy leader history [--election <name>] [--json]
  caddy leader resign [--election <name> | --shards <set>] [--hold-off <duration>]
  caddy leader transfer --to <instance_id> [--election <name>] [--timeout <duration>]
  caddy leader jobs [--json]
  caddy leader jobs run <job> [--shard <n>]

--election may be left out when the instance takes part in one election only
(status then lists every election).

A shard (--election <set>.<n>) is transferred only to the instance placement
prefers for it; to move shards, resign their owner (--shards) or change
priorities. resign --shards holds the instance off every shard of the set.

ENDED in the history says how each term ended: handed over (the leader shut
down, or a reload dropped the election), resigned, transferred, key deleted
(by an operator), deadline missed (its heartbeats did not reach the store in
time, and it said so), or crashed (no word from it: killed, hung or cut off).
`,
		CobraFunc: func(cmd *cobra.Command) {
			// Without a subcommand, or with an unknown one, say so: left to cobra, the
			// flags after an unknown subcommand would be blamed instead.
			cmd.DisableFlagParsing = true
			cmd.RunE = func(c *cobra.Command, args []string) error {
				if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
					return c.Help()
				}
				return fmt.Errorf("unknown subcommand %q for %q: use status, shards, history, resign, transfer or jobs (see 'caddy leader --help')", args[0], c.CommandPath())
			}
			cmd.AddCommand(leaderSubcommand("status", "[--election <name>] [--json]", "Lists the elections this instance takes part in",
				func(c *cobra.Command) { c.Flags().Bool("json", false, "Print the admin API's JSON instead of a table") },
				func(fl caddycmd.Flags, out io.Writer, addr string) error {
					return leaderStatus(out, addr, fl.String("election"), fl.Bool("json"))
				}))
			shardsCmd := leaderSubcommand("shards", "[<set>] [--json]", "Lists the shards of a shard set: owner, token and preferred owner of each",
				func(c *cobra.Command) { c.Flags().Bool("json", false, "Print the admin API's JSON instead of a table") },
				func(fl caddycmd.Flags, out io.Writer, addr string) error {
					return leaderShards(out, addr, fl.Arg(0), fl.Bool("json"))
				})
			shardsCmd.Args = cobra.MaximumNArgs(1)
			cmd.AddCommand(shardsCmd)
			cmd.AddCommand(leaderSubcommand("history", "[--election <name>] [--json]", "Lists the ended terms of an election, as the store keeps them",
				func(c *cobra.Command) { c.Flags().Bool("json", false, "Print the admin API's JSON instead of a table") },
				func(fl caddycmd.Flags, out io.Writer, addr string) error {
					return leaderHistory(out, addr, fl.String("election"), fl.Bool("json"))
				}))
			cmd.AddCommand(leaderSubcommand("resign", "[--election <name> | --shards <set>] [--hold-off <duration>]", "Makes the leader hand over and stay out for a while",
				func(c *cobra.Command) {
					c.Flags().String("hold-off", "", "How long the leader stays out of the election, e.g. 30s (default: one ttl)")
					c.Flags().String("shards", "", "Resign every shard of this shard set that the instance owns, and stay out of the whole set for the hold-off")
				},
				func(fl caddycmd.Flags, out io.Writer, addr string) error {
					return leaderResign(out, addr, fl.String("election"), fl.String("shards"), fl.String("hold-off"))
				}))
			cmd.AddCommand(leaderSubcommand("transfer", "--to <instance_id> [--election <name>] [--timeout <duration>] [--force]", "Hands leadership over to a named candidate",
				func(c *cobra.Command) {
					c.Flags().String("to", "", "The instance_id that should lead (required)")
					c.Flags().String("timeout", "", "How long to wait for it to lead, e.g. 20s (default: two ttls)")
					c.Flags().Bool("force", false, "Transfer a shard to another instance than the one placement prefers, which moves it back soon after")
				},
				func(fl caddycmd.Flags, out io.Writer, addr string) error {
					return leaderTransfer(out, addr, fl.String("election"), fl.String("to"), fl.String("timeout"), fl.Bool("force"))
				}))
			cmd.AddCommand(jobsCommand())
		},
	})
}

// leaderSubcommand is one `caddy leader` subcommand with the flags that every one of them
// takes: the election, and the admin address.
func leaderSubcommand(name, usage, short string, flags func(*cobra.Command),
	run func(fl caddycmd.Flags, out io.Writer, adminAddr string) error,
) *cobra.Command {
	c := &cobra.Command{Use: name + " " + usage, Short: short, Args: cobra.NoArgs}
	c.Flags().String("election", "", "The election (default: the only one)")
	c.Flags().StringP("config", "c", "", "Configuration file to read the admin address from, if --address is not used")
	c.Flags().StringP("adapter", "a", "", "Name of config adapter to apply (when --config is used)")
	c.Flags().String("address", "", "The address of the admin API (host:port, or http://host:port), if not the default")
	flags(c)
	// cobra prints these errors (a flag or an argument it does not know) as `caddy reload`'s;
	// the hint says where the right ones are listed.
	c.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%v (see '%s --help')", err, c.CommandPath())
	})
	c.RunE = caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
		addr, err := adminAddress(fl.String("address"), fl.String("config"), fl.String("adapter"))
		if err == nil {
			err = run(fl, c.OutOrStdout(), addr)
		}
		if err != nil {
			// A plain sentence on stderr, not a JSON log line with the API's answer quoted
			// inside it; the exit status says it failed, and cobra adds nothing.
			fmt.Fprintf(c.ErrOrStderr(), "caddy leader %s: %v\n", name, err)
			c.SilenceErrors = true
			return caddy.ExitCodeFailedQuit, nil
		}
		return caddy.ExitCodeSuccess, nil
	})
	return c
}

// adminAddress is the admin API's address as `caddy reload` finds it: --address, else the
// --config file's admin option, else the default. --address may carry an http:// scheme
// and a trailing slash, as an admin URL is often written.
func adminAddress(address, config, adapter string) (string, error) {
	if rest, ok := strings.CutPrefix(address, "http://"); ok {
		address = strings.TrimSuffix(rest, "/")
		if address == "" || strings.Contains(address, "/") {
			return "", fmt.Errorf("--address: %q: give the admin API's host:port, e.g. localhost:2019", "http://"+rest)
		}
	} else if strings.HasPrefix(address, "https://") {
		return "", fmt.Errorf("--address: %q: the admin API answers plain HTTP on its listen address (default localhost:2019); give host:port", address)
	}
	addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
	if err != nil {
		return "", fmt.Errorf("couldn't determine the admin API address: %v", err)
	}
	return addr, nil
}

// adminCall sends one request to the leader endpoints of the admin API and decodes the JSON
// answer into into. AdminAPIRequest turns an error status into an error that carries the
// API's message.
func adminCall(adminAddr, method, uri string, into any) error {
	resp, err := caddycmd.AdminAPIRequest(adminAddr, method, uri, nil, nil)
	if err != nil {
		return plainAdminError(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %v", method, uri, err)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return notAdminAnswer(adminAddr, method, uri, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	return nil
}

// notAdminAnswer explains an answer that is not the admin API's JSON: most likely the
// address is a site's, not the admin endpoint's.
func notAdminAnswer(adminAddr, method, uri string, status int, contentType string, body []byte) error {
	start := strings.Join(strings.Fields(string(body)), " ")
	if len(start) > 60 {
		start = start[:60] + "..."
	}
	if contentType == "" {
		contentType = "no Content-Type"
	}
	return fmt.Errorf("%s %s: %s answered HTTP %d with %s (%q), not the admin API's JSON: is it the admin address (the admin global option; default localhost:2019) and not a site's?",
		method, uri, adminAddr, status, contentType, start)
}

// plainAdminError turns the error of caddycmd.AdminAPIRequest, which quotes the admin API's
// JSON answer ("caddy responded with error: HTTP 409: {\"error\":\"...\"}"), into the
// sentence the API sent and its status.
func plainAdminError(err error) error {
	msg := err.Error()
	rest, ok := strings.CutPrefix(msg, "caddy responded with error: HTTP ")
	if !ok {
		return fmt.Errorf("the admin API did not answer: %s", msg)
	}
	code, body, _ := strings.Cut(rest, ": ")
	var answer struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(body), &answer) == nil && answer.Error != "" {
		body = answer.Error
	}
	return fmt.Errorf("%s (HTTP %s)", strings.TrimSpace(body), code)
}

func fetchElections(adminAddr string) ([]ElectionStatus, error) {
	st, err := fetchStatus(adminAddr)
	return st.Elections, err
}

// adminStatus is GET /leader/'s answer.
type adminStatus struct {
	Elections []ElectionStatus `json:"elections"`
	ShardSets []ShardSetStatus `json:"shard_sets"`
}

func fetchStatus(adminAddr string) (adminStatus, error) {
	var st adminStatus
	err := adminCall(adminAddr, http.MethodGet, "/leader/", &st)
	return st, err
}

// leaderStatus prints the elections of the instance at adminAddr (only the one named
// election, unless it is empty), as a table or as JSON.
func leaderStatus(out io.Writer, adminAddr, election string, asJSON bool) error {
	st, err := fetchStatus(adminAddr)
	if err != nil {
		return err
	}
	elections, sets := st.Elections, st.ShardSets
	if election != "" {
		sets = nil
	}
	if election != "" {
		elections = slices.DeleteFunc(elections, func(e ElectionStatus) bool { return e.Election != election })
		if len(elections) == 0 {
			for _, set := range st.ShardSets {
				if shard, ok := strings.CutPrefix(election, set.Set+"."); ok {
					return fmt.Errorf("--election: %q is shard %s of shard set %s, which status sums up: 'caddy leader shards %s' lists every shard", election, shard, set.Set, set.Set)
				}
			}
			return fmt.Errorf("--election: this instance takes no part in election %q", election)
		}
	}
	if asJSON {
		return printJSON(out, adminStatus{Elections: elections, ShardSets: sets})
	}
	if len(elections) > 0 || len(sets) == 0 {
		if err := printStatusTable(out, elections, time.Now()); err != nil {
			return err
		}
	}
	if len(sets) > 0 {
		if len(elections) > 0 {
			fmt.Fprintln(out)
		}
		return printShardSetsTable(out, sets)
	}
	return nil
}

// printShardSetsTable writes one row per candidate of every shard set: how many shards it
// owns, how many placement gives it, and the set's shards without an owner or on the move.
func printShardSetsTable(out io.Writer, sets []ShardSetStatus) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD SET\tSHARDS\tLEADERLESS\tMOVING\tCANDIDATE\tOWNS\tSHOULD OWN\tPRIORITY\tHEALTHY\tURL")
	for _, set := range sets {
		for _, c := range set.Candidates {
			self := ""
			if c.ID == set.Self {
				self = " *"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s%s\t%d\t%d\t%d\t%s\t%s\n", set.Set, set.Shards, set.Leaderless, set.Moving,
				c.ID, self, c.Owned, c.Preferred, c.Priority, yesNo(c.Healthy), dash(c.URL))
		}
		if len(set.Candidates) == 0 {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t(no live candidate is known)\n", set.Set, set.Shards, set.Leaderless, set.Moving)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, set := range sets {
		if set.Problem != "" {
			fmt.Fprintf(out, "ERROR: shard set %s: %s\n", set.Set, set.Problem)
		}
	}
	return nil
}

// leaderShards prints the shards of a set, or of the only one, as a table or as JSON.
func leaderShards(out io.Writer, adminAddr, set string, asJSON bool) error {
	if set == "" {
		st, err := fetchStatus(adminAddr)
		if err != nil {
			return err
		}
		switch len(st.ShardSets) {
		case 0:
			return errors.New("this instance takes part in no shard set")
		case 1:
			set = st.ShardSets[0].Set
		default:
			names := make([]string, len(st.ShardSets))
			for i, s := range st.ShardSets {
				names[i] = s.Set
			}
			return fmt.Errorf("this instance takes part in several shard sets: name one of %s", strings.Join(names, ", "))
		}
	}
	var st ShardSetStatus
	if err := adminCall(adminAddr, http.MethodGet, "/leader/shards/"+url.PathEscape(set), &st); err != nil {
		return err
	}
	if asJSON {
		return printJSON(out, st)
	}
	if err := printShardSetsTable(out, []ShardSetStatus{st}); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tELECTION\tOWNER\tTOKEN\tPREFERRED\tROLE HERE")
	for _, sh := range st.List {
		token := "-"
		if sh.Token != 0 {
			token = strconv.FormatInt(sh.Token, 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", sh.Shard, sh.Election, dash(sh.Owner), token, dash(sh.Preferred), sh.Role)
	}
	return tw.Flush()
}

// printStatusTable writes one row per candidate of every election, like `patronictl list`:
// this instance first, marked with *, then the other live candidates the store's registry
// lists. Lease and last contact are known for this instance only. HEALTHY means what the
// leader_health handler tests: the candidate takes part and its lease is live, whether it
// is held off or not (HOLD-OFF shows that).
func printStatusTable(out io.Writer, elections []ElectionStatus, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ELECTION\tCANDIDATE\tROLE\tLEADER\tTOKEN\tPRIORITY\tHOLD-OFF\tLEASE LEFT\tLAST CONTACT\tHEALTHY\tURL")
	for _, e := range elections {
		leader, token, contact := e.LeaderID, strconv.FormatInt(e.Token, 10), "never"
		if leader == "" {
			leader = "none"
		}
		if e.Token == 0 {
			token = "-"
		}
		if !e.LastContact.IsZero() {
			contact = now.Sub(e.LastContact).Round(100*time.Millisecond).String() + " ago"
		}
		url := e.LeaderURL
		if e.LeaderID != e.Self {
			url = ""
		}
		for _, c := range e.Candidates {
			if c.ID == e.Self {
				url = c.URL
			}
		}
		role := e.Role
		if role != RoleLeader && role != RoleSettling && role != RoleHandingOver && e.Priority == 0 {
			role = "never leads"
		}
		holdOff := holdOffCell(time.Duration(e.HoldOff*float64(time.Second)), e.Leaving)
		lease := (time.Duration(e.LeaseRemaining * float64(time.Second))).Round(100 * time.Millisecond)
		fmt.Fprintf(tw, "%s\t%s *\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Election, e.Self, role, leader, token,
			priorityCell(e.Priority, e.Preempt), holdOff, lease, contact, yesNo(e.Healthy), dash(url))
		for _, c := range e.Candidates {
			if c.ID == e.Self {
				continue
			}
			// Only the holder knows whether its term has settled: to its peers it leads.
			role := RoleFollower
			switch {
			case c.ID == e.LeaderID:
				role = RoleLeader
			case c.Priority == 0:
				role = "never leads"
			case e.LeaderID == "":
				role = RoleCandidate
			}
			var left time.Duration
			if !c.HoldOffUntil.IsZero() {
				left = c.HoldOffUntil.Sub(now)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t-\t-\t%s\t%s\n", e.Election, c.ID, role, leader, token,
				priorityCell(c.Priority, c.Preempt), holdOffCell(left, c.Leaving), yesNo(c.Healthy), dash(c.URL))
		}
		if e.CandidatesError != "" {
			fmt.Fprintf(tw, "%s\t(the other candidates are unknown: %s)\n", e.Election, e.CandidatesError)
		}
		if note := failsafeNote(e.Failsafe, now); note != "" {
			fmt.Fprintf(tw, "%s\t(%s)\n", e.Election, note)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(elections) > 0 {
		_, err := fmt.Fprintln(out, "* the instance asked")
		return err
	}
	return nil
}

// priorityCell shows a priority, and preempt when it is set.
func priorityCell(p int, preempt bool) string {
	s := strconv.Itoa(p)
	if preempt {
		s += " preempt"
	}
	return s
}

// holdOffCell shows how long a candidate still stays out of the election.
func holdOffCell(left time.Duration, leaving bool) string {
	switch {
	case leaving:
		return "leaving"
	case left <= 0:
		return "-"
	default:
		return left.Round(time.Second).String()
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// leaderHistory prints the ended terms of an election, as a table or as JSON.
func leaderHistory(out io.Writer, adminAddr, election string, asJSON bool) error {
	election, err := chooseElection(adminAddr, election)
	if err != nil {
		return err
	}
	var h HistoryStatus
	if err := adminCall(adminAddr, http.MethodGet, "/leader/"+url.PathEscape(election)+"/history", &h); err != nil {
		return err
	}
	if asJSON {
		return printJSON(out, h)
	}
	if len(h.Terms) == 0 {
		_, err := fmt.Fprintf(out, "election %s: no term has ended yet (the store keeps the terms that ended, with how and when)\n", election)
		return err
	}
	return printHistoryTable(out, h)
}

// printHistoryTable writes one row per ended term, oldest first, like `patronictl history`.
func printHistoryTable(out io.Writer, h HistoryStatus) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ELECTION\tTOKEN\tLEADER\tSTART\tEND\tDURATION\tENDED\tSUCCESSOR")
	for _, p := range h.Terms {
		leader, start, lasted := p.Leader, elector.Unknown, elector.Unknown
		if leader == "" {
			leader = elector.Unknown
		}
		if d, ok := p.Lasted(); ok {
			start, lasted = p.Start.UTC().Format(time.RFC3339), d.Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Election, p.Token, leader,
			start, p.End.UTC().Format(time.RFC3339), lasted, p.Ended, p.Successor)
	}
	return tw.Flush()
}

// chooseElection returns name, or the only election of the instance when name is empty.
func chooseElection(adminAddr, name string) (string, error) {
	if name != "" {
		return name, nil
	}
	elections, err := fetchElections(adminAddr)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(elections))
	for _, e := range elections {
		names = append(names, e.Election)
	}
	sort.Strings(names)
	switch len(names) {
	case 1:
		return names[0], nil
	case 0:
		return "", errors.New("this instance takes part in no election")
	default:
		return "", fmt.Errorf("--election: this instance takes part in several elections (%s): name one", strings.Join(names, ", "))
	}
}

// leaderResign asks the leader of an election to hand over and stay out for holdOff (the
// admin API's default, one ttl, when empty).
func leaderResign(out io.Writer, adminAddr, election, set, holdOff string) error {
	if err := checkDurationFlag("hold-off", holdOff); err != nil {
		return err
	}
	if set != "" {
		if election != "" {
			return errors.New("--shards: resign either an election (--election, which may be one shard, <set>.<n>) or every shard this instance owns in a set (--shards), not both")
		}
		return resignShardSet(out, adminAddr, set, holdOff)
	}
	election, err := chooseElection(adminAddr, election)
	if err != nil {
		return err
	}
	uri := "/leader/" + url.PathEscape(election) + "/resign"
	if holdOff != "" {
		uri += "?" + url.Values{"hold_off": {holdOff}}.Encode()
	}
	var result struct {
		Resigned string `json:"resigned"`
		Asked    string `json:"asked"`
		Token    int64  `json:"token"`
		HoldOff  string `json:"hold_off"`
	}
	if err := adminCall(adminAddr, http.MethodPost, uri, &result); err != nil {
		return err
	}
	if result.Resigned != "" {
		_, err = fmt.Fprintf(out, "%s resigned election %s (term %d); it stays out for %s\n", result.Resigned, election, result.Token, result.HoldOff)
	} else {
		_, err = fmt.Fprintf(out, "asked leader %s of election %s (term %d) to resign and stay out for %s\n", result.Asked, election, result.Token, result.HoldOff)
	}
	return err
}

// resignShardSet makes the instance hand over every shard of set it owns.
func resignShardSet(out io.Writer, adminAddr, set, holdOff string) error {
	uri := "/leader/shards/" + url.PathEscape(set) + "/resign"
	if holdOff != "" {
		uri += "?" + url.Values{"hold_off": {holdOff}}.Encode()
	}
	var result struct {
		Resigned []int  `json:"resigned"`
		HoldOff  string `json:"hold_off"`
	}
	if err := adminCall(adminAddr, http.MethodPost, uri, &result); err != nil {
		return err
	}
	_, err := fmt.Fprintf(out, "resigned %d shards of set %s; this instance stays out of them for %s\n", len(result.Resigned), set, result.HoldOff)
	return err
}

// leaderTransfer hands the leadership of an election over to the candidate named to, and
// returns once it leads or the admin API gives up.
func leaderTransfer(out io.Writer, adminAddr, election, to, timeout string, force bool) error {
	if to == "" {
		return errors.New("--to: name the instance_id that should lead")
	}
	if err := checkDurationFlag("timeout", timeout); err != nil {
		return err
	}
	election, err := chooseElection(adminAddr, election)
	if err != nil {
		return err
	}
	var result struct {
		From    string `json:"from"`
		Leader  string `json:"leader"`
		Token   int64  `json:"token"`
		Warning string `json:"warning"`
	}
	query := url.Values{"to": {to}}
	if timeout != "" {
		query.Set("timeout", timeout)
	}
	if force {
		query.Set("force", "true")
	}
	uri := "/leader/" + url.PathEscape(election) + "/transfer?" + query.Encode()
	if err := adminCall(adminAddr, http.MethodPost, uri, &result); err != nil {
		return err
	}
	from := result.From
	if from == "" {
		from = "nobody"
	}
	if _, err = fmt.Fprintf(out, "election %s: %s leads now (term %d); before, %s led\n", election, result.Leader, result.Token, from); err != nil {
		return err
	}
	if result.Warning != "" {
		_, err = fmt.Fprintf(out, "warning: %s\n", result.Warning)
	}
	return err
}

// printJSON prints an admin API answer as indented JSON, for --json.
func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// checkDurationFlag checks a duration flag before it is sent: a number without a unit is the
// usual slip.
func checkDurationFlag(flag, value string) error {
	if value == "" {
		return nil
	}
	d, err := caddy.ParseDuration(value)
	switch {
	case err == nil && d >= 0:
		return nil
	case strings.Trim(value, "0123456789.") == "":
		return fmt.Errorf("--%s: %q has no unit: write %ss, %sm or %sh", flag, value, value, value, value)
	default:
		return fmt.Errorf("--%s: %q is not a non-negative duration such as 30s, 5m or 1h", flag, value)
	}
}
