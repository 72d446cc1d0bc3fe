package caddyleader

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// jobsCommand is `caddy leader jobs` and its `run` subcommand.
func jobsCommand() *cobra.Command {
	c := leaderSubcommand("jobs", "[--json] | run <job> [--shard <n>]", "Lists the scheduled jobs: last run, result and next run of each",
		func(c *cobra.Command) { c.Flags().Bool("json", false, "Print the admin API's JSON instead of a table") },
		func(fl caddycmd.Flags, out io.Writer, addr string) error {
			return leaderJobs(out, addr, fl.Bool("json"))
		})
	run := leaderSubcommand("run", "<job> [--shard <n>]", "Runs a job now: on this instance if it leads the job's election (or shard), else on the leader, asked through the store",
		func(c *cobra.Command) {
			c.Flags().Int("shard", -1, "The shard to run a job on a shard set for (required for such a job)")
		},
		func(fl caddycmd.Flags, out io.Writer, addr string) error {
			return leaderRunJob(out, addr, fl.Arg(0), fl.Int("shard"))
		})
	run.Args = cobra.ExactArgs(1)
	c.AddCommand(run)
	return c
}

// leaderJobs prints the jobs of the instance at adminAddr, as a table or as JSON.
func leaderJobs(out io.Writer, adminAddr string, asJSON bool) error {
	var answer jobsAnswer
	if err := adminCall(adminAddr, http.MethodGet, "/leader/jobs", &answer); err != nil {
		return err
	}
	if asJSON {
		return printJSON(out, answer)
	}
	if len(answer.Jobs) == 0 {
		_, err := fmt.Fprintln(out, "no scheduled job is configured (see `job` in the leader global option)")
		return err
	}
	return printJobsTable(out, answer.Jobs, time.Now())
}

// printJobsTable writes one row per job and election (per shard for a job on a shard set).
func printJobsTable(out io.Writer, list []JobStatus, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tELECTION\tSCHEDULE\tSTARTED\tFINISHED\tBY\tRESULT\tDURATION\tNEXT")
	for _, j := range list {
		for _, st := range j.Leads {
			started, finished, by, result, took := "-", "-", "-", "-", "-"
			if rec := st.Record; rec != nil {
				if m := rec.Started; m != nil {
					started, by = slotCell(m.Slot), m.By
				}
				if m := rec.Finished; m != nil {
					finished, by, result, took = slotCell(m.Slot), m.By, m.Result, m.Took.Round(time.Millisecond).String()
				}
			}
			if st.Running != nil {
				result = "running"
			}
			next := "-"
			if !st.Next.IsZero() {
				next = slotCell(st.Next) + " (in " + st.Next.Sub(now).Round(time.Second).String() + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.Job, st.Election, st.Schedule, started, finished, by, result, took, next)
		}
	}
	return tw.Flush()
}

// slotCell is a slot in the table: UTC, as the records and headers give it.
func slotCell(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// leaderRunJob asks the instance at adminAddr to run job now (under shard, -1 for none).
func leaderRunJob(out io.Writer, adminAddr, job string, shard int) error {
	uri := "/leader/jobs/" + url.PathEscape(job) + "/run"
	if shard >= 0 {
		uri += "?" + url.Values{"shard": {strconv.Itoa(shard)}}.Encode()
	}
	var answer jobRunAnswer
	if err := adminCall(adminAddr, http.MethodPost, uri, &answer); err != nil {
		return err
	}
	if run := answer.Run; run != nil {
		_, err := fmt.Fprintf(out, "job %s: run started on %s under %s (term %d)\n", job, run.Instance, run.Election, run.Token)
		return err
	}
	_, err := fmt.Fprintf(out, "job %s: asked %s, the leader of %s (term %d), to run it now\n", job, answer.Asked, answer.Election, answer.Token)
	return err
}
