package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/uploads"
)

// auditCmd prints the operators' audit (internal/audit).
type auditCmd struct {
	Since string `name:"since" help:"Only actions recorded at or after this: an RFC 3339 time, or a duration before now (24h)."`
	Limit int    `name:"limit" default:"100" help:"Print at most this many actions, newest first (1 to 10000)."`
	JSON  bool   `name:"json" help:"One JSON object per action, one per line, instead of a table."`
}

// Run lists the operator actions recorded, newest first: who (the actor,
// from the credential: an operator token's name or a command's database
// login), through which door and database login, when, what (action,
// outcome, batch, tenant, queue), why (reason) and the caller's note. It
// needs a login that may read the audit (fleet_operator).
func (a *auditCmd) Run(c *enqueueCLI, e *cli.Env) error {
	since, err := whenFlag(a.Since)
	if err != nil {
		return invalid(e, &jobs.InputError{Field: "since", Reason: err.Error()})
	}
	if a.Limit < 1 || a.Limit > 10000 {
		return invalid(e, &jobs.InputError{Field: "limit", Reason: "must be between 1 and 10000"})
	}
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	entries, err := audit.List(ctx, pool, audit.Filter{Since: since, Limit: a.Limit})
	if err != nil {
		return err
	}
	if a.JSON {
		for _, en := range entries {
			printJSON(e.Stdout, en)
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAT\tACTOR\tDOOR\tLOGIN\tACTION\tOUTCOME\tBATCH\tTENANT\tQUEUE\tREASON\tNOTE")
	for _, en := range entries {
		batchID := ""
		if en.BatchID != 0 {
			batchID = strconv.FormatInt(en.BatchID, 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", en.ID, en.At.UTC().Format(time.RFC3339),
			oneLine(en.Actor, 40), cell(en.Door), oneLine(en.Login, 40), cell(en.Action), cell(en.Outcome), cell(batchID),
			oneLine(en.TenantID, 40), oneLine(en.Queue, 40), oneLine(en.Reason, 60), oneLine(en.Note, 60))
	}
	return tw.Flush()
}

// operatorTokenCmd mints an operator token.
type operatorTokenCmd struct {
	Name string `name:"name" required:"" help:"The operator the token names: who acts, in the operators' audit (letters, digits and . _ @ -, at most 64)."`
}

// Run mints an operator token and prints {"outcome":"minted","operator",
// "token","line"}. It touches no database: the line goes into enqueue
// serve's --operator-token-file, the token to the operator.
func (m *operatorTokenCmd) Run(e *cli.Env) error {
	token, line, err := uploads.MintOperatorToken(m.Name)
	if err != nil {
		return invalid(e, &jobs.InputError{Field: "name", Reason: err.Error()})
	}
	printJSON(e.Stdout, map[string]string{"outcome": "minted", "operator": m.Name, "token": token, "line": line})
	return nil
}
