package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/jobs"
)

type statusCmd struct {
	BatchID  int64  `name:"batch-id" required:"" help:"The batch to show."`
	TenantID string `name:"tenant-id" help:"Only show the batch if it belongs to this tenant (otherwise not_found)."`
	JSON     bool   `name:"json" help:"Print JSON instead of a table."`
}

type listCmd struct {
	Status   string `name:"status" enum:",Running,Succeeded,Failed" default:"" help:"Only batches with this status (Running, Succeeded, Failed)."`
	TenantID string `name:"tenant-id" help:"Only this tenant's batches."`
	Stuck    bool   `name:"stuck" help:"Only Running batches whose execution lease has expired."`
	Limit    int    `name:"limit" default:"50" help:"At most this many batches."`
	JSON     bool   `name:"json" help:"Print JSON lines instead of a table."`
}

// batchView is what status and list show of a batch.
type batchView struct {
	BatchID           int64      `json:"batch_id"`
	TenantID          string     `json:"tenant_id"`
	SourceType        string     `json:"source_type"`
	SourceScope       string     `json:"source_scope,omitempty"`
	Status            string     `json:"status"`
	Phase             string     `json:"phase,omitempty"`
	RedshiftCommitted bool       `json:"redshift_committed"`
	RecordCount       int64      `json:"record_count,omitempty"`
	LeaseHolder       string     `json:"lease_holder,omitempty"`
	LeaseExpiresAt    *time.Time `json:"lease_expires_at,omitempty"`
	LeaseExpiresIn    string     `json:"lease_expires_in,omitempty"`
	LeaseGeneration   int64      `json:"lease_generation"`
	StartedAt         time.Time  `json:"started_at"`
	CompletedAt       *time.Time `json:"completed_at,omitempty"`
	AgeSeconds        float64    `json:"age_seconds"`
	LastError         string     `json:"last_error,omitempty"`
	DetailsError      string     `json:"details_error,omitempty"`
}

func view(b batch.Batch, now time.Time) batchView {
	v := batchView{
		BatchID: b.ID, TenantID: b.TenantID, SourceType: string(b.SourceType), SourceScope: b.Scope(),
		Status: string(b.Status), LeaseExpiresAt: b.LeaseExpiresAt, LeaseGeneration: b.LeaseGeneration,
		StartedAt: b.StartedAt, CompletedAt: b.CompletedAt,
	}
	end := now
	if b.CompletedAt != nil {
		end = *b.CompletedAt
	}
	v.AgeSeconds = end.Sub(b.StartedAt).Round(time.Millisecond).Seconds()
	if b.LeaseID != nil {
		v.LeaseHolder = *b.LeaseID
	}
	if b.LeaseExpiresAt != nil {
		v.LeaseExpiresIn = b.LeaseExpiresAt.Sub(now).Round(time.Millisecond).String()
	}
	if b.SourceScope != nil {
		d, err := batch.ParseDetails(b.Details)
		if err != nil {
			v.DetailsError = err.Error()
		} else {
			v.Phase, v.RedshiftCommitted, v.RecordCount = string(d.Phase), d.RedshiftCommitted, d.RecordCount
			if d.LastError != nil {
				v.LastError = d.LastError.Message
			}
		}
	}
	return v
}

func (s *statusCmd) Run(c *enqueueCLI, e *cli.Env) error {
	if s.BatchID <= 0 {
		return invalid(e, &jobs.InputError{Field: "batch_id", Reason: "must be a positive batch id"})
	}
	if s.TenantID != "" {
		if err := batch.ValidateTenantID(s.TenantID); err != nil {
			return invalid(e, &jobs.InputError{Field: "tenant_id", Reason: err.Error()})
		}
	}
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	store := batch.NewStore(pool)
	b, err := store.Get(ctx, s.BatchID)
	if err == nil && s.TenantID != "" && b.TenantID != s.TenantID {
		err = batch.ErrNotFound // never reveal another tenant's batch
	}
	if errors.Is(err, batch.ErrNotFound) {
		printJSON(e.Stdout, map[string]any{"outcome": jobs.OutcomeNotFound, "batch_id": s.BatchID})
		return cli.ExitError{Code: cli.ExitNotResumable, Err: err}
	}
	if err != nil {
		return err
	}
	now, err := store.Now(ctx)
	if err != nil {
		return err
	}
	v := view(b, now)
	if s.JSON {
		printJSON(e.Stdout, v)
		return nil
	}
	printTable(e.Stdout, []batchView{v})
	return nil
}

func (l *listCmd) Run(c *enqueueCLI, e *cli.Env) error {
	if l.TenantID != "" {
		if err := batch.ValidateTenantID(l.TenantID); err != nil {
			return invalid(e, &jobs.InputError{Field: "tenant_id", Reason: err.Error()})
		}
	}
	if l.Limit < 1 || l.Limit > 10000 {
		return invalid(e, &jobs.InputError{Field: "limit", Reason: "must be between 1 and 10000"})
	}
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	batches, now, err := batch.NewStore(pool).List(ctx, batch.ListFilter{
		Status: batch.Status(l.Status), TenantID: l.TenantID, Stuck: l.Stuck, Limit: l.Limit,
	})
	if err != nil {
		return err
	}
	views := make([]batchView, 0, len(batches))
	for _, b := range batches {
		views = append(views, view(b, now))
	}
	if l.JSON {
		for _, v := range views {
			printJSON(e.Stdout, v)
		}
		return nil
	}
	printTable(e.Stdout, views)
	return nil
}

// printTable prints views as a table for people. Every text cell goes
// through inert: object names, error messages and lease holders come from
// outside (an S3 key can hold any byte) and must not drive the operator's
// terminal.
func printTable(w io.Writer, views []batchView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tTENANT\tSTATUS\tPHASE\tCOMMITTED\tLEASE HOLDER\tLEASE EXPIRES IN\tGEN\tAGE\tSCOPE\tLAST ERROR")
	for _, v := range views {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%t\t%s\t%s\t%d\t%s\t%s\t%s\n",
			v.BatchID, cell(v.TenantID), cell(v.Status), cell(v.Phase), v.RedshiftCommitted, cell(v.LeaseHolder), cell(v.LeaseExpiresIn),
			v.LeaseGeneration, (time.Duration(v.AgeSeconds * float64(time.Second))).Round(time.Second), cell(v.SourceScope),
			oneLine(v.LastError+v.DetailsError, 60))
	}
	tw.Flush()
}

// cell is one inert table cell; "-" when empty.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return inert(s)
}

// oneLine is an inert cell of at most n characters, its whitespace runs
// collapsed.
func oneLine(s string, n int) string {
	s = cell(strings.Join(strings.Fields(s), " "))
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		return string(r[:n-1]) + "…"
	}
	return s
}

// inert returns s unchanged when every character of it is printable, and
// otherwise s Go-quoted (%q): ESC becomes \x1b, BEL \a, a C1 control or
// a bidirectional override \u…, invalid UTF-8 \x…. A hostile value then
// shows as text instead of retitling, clearing or rewriting the terminal
// (ESC]0;…BEL, ESC[2J), and cannot hide or reorder what follows it; a
// quoted value is visibly different from a plain one.
func inert(s string) string {
	for i, r := range s {
		if !unicode.IsPrint(r) || (r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD")) {
			return strconv.Quote(s)
		}
	}
	return s
}

// inertJSON escapes, inside the JSON strings of b, the characters that
// encoding/json leaves raw but a terminal may act on (DEL, C1 controls such
// as U+009B CSI, bidirectional and other invisible formatting characters):
// the result is the same JSON value, and inert on a terminal.
func inertJSON(b []byte) []byte {
	clean := true
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && r != '\n' {
			clean = false
			break
		}
	}
	if clean {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for _, r := range string(b) {
		if unicode.IsPrint(r) || r == '\n' {
			out = utf8.AppendRune(out, r)
			continue
		}
		// Outside strings, valid JSON holds only printable characters and
		// whitespace, which encoding/json does not emit; so r is inside a
		// string, where \uXXXX (a surrogate pair above the BMP) means r.
		if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return out
}
