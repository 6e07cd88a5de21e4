package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/term"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/batchview"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/warehousecli"
)

type statusCmd struct {
	BatchID  int64         `name:"batch-id" required:"" help:"The batch to show."`
	TenantID string        `name:"tenant-id" help:"Only show the batch if it belongs to this tenant (otherwise not_found)."`
	JSON     bool          `name:"json" help:"Print JSON instead of a table."`
	Watch    bool          `name:"watch" help:"Redraw a progress line until the batch is terminal (with --json: one JSON line per change)."`
	Interval time.Duration `name:"interval" default:"1s" help:"How often --watch looks at the batch."`
	Objects  bool          `name:"objects" help:"List the batch's load ledger instead: one row per object its warehouse slice was loaded from (key, ETag, size, records, last modified), read from the warehouse the workers load (--warehouse, --warehouse-url, --redshift-*). Exits 8 when the slice belongs to another batch, or there is none."`
	Errors   bool          `name:"errors" help:"List the batch's load errors instead: one row per bad record its load skipped within the import's tolerance (--max-bad-records): object, line, column, reason and an excerpt of the raw value, read from the warehouse as --objects does. Exits 8 as --objects does."`

	// The warehouse whose load ledger --objects reads: the same settings
	// as the workers' (--redshift-iam-role and --redshift-staging are not
	// needed to read it).
	warehousecli.Flags
}

type listCmd struct {
	Status   string `name:"status" enum:",Running,Succeeded,Failed" default:"" help:"Only batches with this status (Running, Succeeded, Failed)."`
	TenantID string `name:"tenant-id" help:"Only this tenant's batches."`
	Stuck    bool   `name:"stuck" help:"Only Running batches no delivery is working on: expired lease, or parked."`
	Parked   bool   `name:"parked" help:"Only parked batches (Running, but this build cannot work on them)."`
	Limit    int    `name:"limit" default:"50" help:"At most this many batches."`
	JSON     bool   `name:"json" help:"Print JSON lines instead of a table."`
	Output   string `name:"output" short:"o" enum:",wide" default:"" help:"wide: every column (lease, generation, River jobs, retry, scope, last error); the default table fits 100 columns."`
	Folder   string `name:"folder" help:"Only this folder's batches (needs --tenant-id)."`
	Since    string `name:"since" help:"Only batches reserved at or after this: an RFC 3339 time, or a duration before now (24h). Needs --tenant-id."`
	Until    string `name:"until" help:"Only batches reserved before this: an RFC 3339 time, or a duration before now. Needs --tenant-id."`
	Cursor   string `name:"cursor" help:"Continue after the page that printed this cursor (a page of --folder/--since/--until, or of --tenant-id with --cursor): the last line (JSON) or stderr (table) gives the next one."`
	Newest   bool   `name:"newest" help:"Only each folder's newest batch (with --status Failed: the folders whose newest batch failed; a page of --tenant-id, as GET /v1/batches?newest=true)."`
	Tenants  bool   `name:"tenants" help:"Per tenant instead of per batch: Running batches holding a lease (running) and waiting for one (waiting; not parked), as worker --max-running-per-tenant counts them. With --tenant-id, that tenant only."`
}

// tenantView is a line of list --tenants.
type tenantView struct {
	TenantID string `json:"tenant_id"`
	Running  int64  `json:"running"`
	Waiting  int64  `json:"waiting"`
}

// listTenants prints list --tenants: every tenant with a Running scoped
// batch, busiest first.
func (l *listCmd) listTenants(ctx context.Context, pool *pgxpool.Pool, e *cli.Env) error {
	rows, err := pool.Query(ctx, `
		SELECT tenant_id,
		       count(*) FILTER (WHERE execution_lease_id IS NOT NULL AND execution_lease_expires_at > now()),
		       count(*) FILTER (WHERE parked_at IS NULL AND (execution_lease_id IS NULL OR execution_lease_expires_at <= now()))
		FROM ingestion_batches
		WHERE status = 'Running' AND source_scope IS NOT NULL AND ($1 = '' OR tenant_id = $1)
		GROUP BY tenant_id
		ORDER BY 2 DESC, 3 DESC, 1
		LIMIT $2`, l.TenantID, l.Limit)
	if err != nil {
		return err
	}
	views, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tenantView, error) {
		var v tenantView
		return v, r.Scan(&v.TenantID, &v.Running, &v.Waiting)
	})
	if err != nil {
		return err
	}
	if l.JSON {
		for _, v := range views {
			printJSON(e.Stdout, v)
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tRUNNING\tWAITING")
	for _, v := range views {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", cell(v.TenantID), v.Running, v.Waiting)
	}
	return tw.Flush()
}

// batchView is what status and list show of a batch (batchview.View, the
// schema the door's GET /v1/batches answers with too).
type batchView = batchview.View

// objectsView is a load's objects summary as status shows it.
type objectsView = batchview.Objects

// view is the View of b at now.
func view(b batch.Batch, now time.Time) batchView { return batchview.Of(b, now) }

// addLinks fills in the River jobs and retries of views, and the paused
// queue a waiting batch waits in. A login that may not read river_queue
// (fleet_enqueue before roles.sql granted it) shows no paused queue.
func addLinks(ctx context.Context, pool *pgxpool.Pool, views []batchView) error {
	if err := batchview.AddLinks(ctx, pool, views); err != nil {
		return err
	}
	var pgErr *pgconn.PgError
	if err := batchview.AddPausedQueues(ctx, pool, views); err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42501") {
		return err
	}
	return nil
}

// pausedNote says that a batch waits in a paused queue, and what resumes
// it.
func pausedNote(v batchView) string {
	return "waiting: River queue " + v.QueuePaused + " is paused (resume it in the River UI, Queues)"
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
	if s.Watch && s.Interval < 100*time.Millisecond {
		return invalid(e, &jobs.InputError{Field: "interval", Reason: "must be at least 100ms"})
	}
	if s.Objects && s.Watch {
		return invalid(e, &jobs.InputError{Field: "objects", Reason: "lists a committed slice's objects once: not with --watch"})
	}
	if s.Errors && s.Watch {
		return invalid(e, &jobs.InputError{Field: "errors", Reason: "lists a committed slice's load errors once: not with --watch"})
	}
	if s.Errors && s.Objects {
		return invalid(e, &jobs.InputError{Field: "errors", Reason: "lists the load errors: not with --objects, which lists the ledger"})
	}
	if s.Objects || s.Errors {
		if err := s.Flags.Validate(false); err != nil {
			return invalidFlag(e, err)
		}
	}
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := batch.NewStore(pool)
	look := func() (batchView, error) {
		ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
		defer cancel()
		b, err := store.Get(ctx, s.BatchID)
		if err == nil && s.TenantID != "" && b.TenantID != s.TenantID {
			err = batch.ErrNotFound // never reveal another tenant's batch
		}
		if err != nil {
			return batchView{}, err
		}
		now, err := store.Now(ctx)
		if err != nil {
			return batchView{}, err
		}
		views := []batchView{view(b, now)}
		if err := addLinks(ctx, pool, views); err != nil {
			return batchView{}, err
		}
		return views[0], nil
	}
	v, err := look()
	if errors.Is(err, batch.ErrNotFound) {
		printJSON(e.Stdout, map[string]any{"outcome": jobs.OutcomeNotFound, "batch_id": s.BatchID})
		return cli.ExitError{Code: cli.ExitNotResumable, Err: err}
	}
	if err != nil {
		return err
	}
	if s.Objects || s.Errors {
		return s.ledger(c, e, pool, v)
	}
	if s.Watch {
		return s.watch(e, v, look)
	}
	if s.JSON {
		printJSON(e.Stdout, v)
		return nil
	}
	printTable(e.Stdout, []batchView{v})
	if v.QueuePaused != "" {
		fmt.Fprintln(e.Stdout, "\nThe batch is "+pausedNote(v)+": no worker takes its job until the queue is resumed.")
	}
	printObjectsSummary(e.Stdout, v)
	printTookOver(e.Stdout, v)
	return nil
}

// printTookOver prints, under status's table, the forgotten batch whose
// warehouse stamp the batch's load took over, when it did.
func printTookOver(w io.Writer, v batchView) {
	t := v.TookOver
	if t == nil {
		return
	}
	uid := ""
	if t.BatchUID != "" {
		uid = " (uid " + inert(t.BatchUID) + ")"
	}
	fmt.Fprintf(w, "\ntook over: the warehouse slice was stamped with batch %d%s, generation %d, which this database does not know "+
		"(forgotten by a restore or a failover behind the warehouse); this batch's load replaced it at %s\n",
		t.BatchID, uid, t.Generation, t.At.UTC().Format(time.RFC3339))
}

// printObjectsSummary prints, under status's table, the summary of the
// objects the batch's load read, when the worker recorded one.
func printObjectsSummary(w io.Writer, v batchView) {
	o := v.Objects
	if o == nil {
		return
	}
	fmt.Fprintf(w, "\nobjects: %d, %d bytes", o.Count, o.Bytes)
	if o.NewestModified != nil {
		fmt.Fprintf(w, ", newest modified %s", o.NewestModified.UTC().Format(time.RFC3339))
	}
	switch {
	case o.Marker != "" && o.MarkerModified != nil:
		fmt.Fprintf(w, ", marker %s modified %s", inert(o.Marker), o.MarkerModified.UTC().Format(time.RFC3339))
	case o.Marker != "":
		fmt.Fprintf(w, ", marker %s", inert(o.Marker))
	default:
		fmt.Fprint(w, ", no marker")
	}
	if o.Late > 0 {
		fmt.Fprintf(w, ", %d late (modified after the marker)", o.Late)
	}
	if o.BadRecords > 0 {
		fmt.Fprintf(w, ", %d bad records skipped (status --errors lists them)", o.BadRecords)
	}
	fmt.Fprintf(w, "\ndigest:  %s\n", inert(o.Digest))
}

// sliceView is the slice's stamp as status --objects and --errors print
// it above their rows.
type sliceView struct {
	Outcome     string     `json:"outcome"`
	BatchID     int64      `json:"batch_id"`
	BatchUID    string     `json:"batch_uid,omitempty"`
	TenantID    string     `json:"tenant_id"`
	SourceScope string     `json:"source_scope"`
	Generation  int64      `json:"lease_generation"`
	RecordCount int64      `json:"record_count"`
	CommittedAt time.Time  `json:"committed_at"`
	PublishedAt *time.Time `json:"published_at,omitempty"`
	// BadRecords counts the bad records the load skipped within the
	// import's tolerance (status --errors lists them).
	BadRecords int64 `json:"bad_records"`
}

// published says whether and when the slice was published.
func (sv sliceView) published() string {
	if sv.PublishedAt == nil {
		return "not published"
	}
	return "published " + sv.PublishedAt.UTC().Format(time.RFC3339)
}

// ledgerView is what status --objects prints: the batch's load ledger, as
// the warehouse holds it with the slice's stamp.
type ledgerView struct {
	sliceView
	// ObjectCount and Bytes add up the objects.
	ObjectCount int64                    `json:"object_count"`
	Bytes       int64                    `json:"bytes"`
	Objects     []warehouse.LedgerObject `json:"objects"`
}

// errorsView is what status --errors prints: the batch's load errors, as
// the warehouse holds them with the slice's stamp.
type errorsView struct {
	sliceView
	Errors []warehouse.LoadError `json:"errors"`
}

// Outcomes of status --objects besides the ledger itself.
const (
	outcomeLedger = "ledger"
	// outcomeErrors: status --errors listed the load errors.
	outcomeErrors = "load_errors"
	// outcomeSliceOfAnotherBatch: the slice is stamped with another batch
	// (a newer one replaced it and its ledger, or the batch never
	// committed its load over an older one).
	outcomeSliceOfAnotherBatch = "slice_of_another_batch"
	// outcomeSliceMissing: the warehouse holds no slice of the batch's
	// scope (reason warehouse_slice_missing, as resume says it).
	outcomeSliceMissing = "warehouse_slice_missing"
)

// ledger prints the load ledger (status --objects) or the load errors
// (status --errors) of v's batch, read from the warehouse with the slice's
// stamp: the rows are the batch's only when the slice is stamped with it;
// otherwise it says whose the slice is and exits ExitNoLedger.
func (s *statusCmd) ledger(c *enqueueCLI, e *cli.Env, pool *pgxpool.Pool, v batchView) error {
	reader, _, closeReader, err := s.Flags.OpenLedger(e.Ctx, c.DatabasePooler, e.Logger)
	if err != nil {
		return invalidFlag(e, err)
	}
	defer closeReader()
	if reader == nil {
		reader = warehouse.NewPostgres(pool) // the local warehouse shares the operational database
	}
	if v.SourceScope == "" {
		printJSON(e.Stdout, map[string]any{"outcome": outcomeSliceMissing, "batch_id": v.BatchID,
			"error": fmt.Sprintf("batch %d has no source scope, so no warehouse slice", v.BatchID)})
		return cli.ExitError{Code: cli.ExitNoLedger}
	}
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	var (
		st      warehouse.Stamp
		objects []warehouse.LedgerObject
		errs    []warehouse.LoadError
		found   bool
		what    = "ledger"
	)
	if s.Errors {
		what = "load errors"
		er, ok := reader.(warehouse.ErrorsReader)
		if !ok {
			return fmt.Errorf("the warehouse %T cannot list load errors", reader)
		}
		st, errs, found, err = er.LoadErrors(ctx, v.TenantID, v.SourceScope)
	} else {
		st, objects, found, err = reader.Ledger(ctx, v.TenantID, v.SourceScope)
	}
	if err != nil {
		return err
	}
	switch {
	case !found:
		printJSON(e.Stdout, map[string]any{"outcome": outcomeSliceMissing, "batch_id": v.BatchID, "tenant_id": v.TenantID, "source_scope": v.SourceScope,
			"error": fmt.Sprintf("the warehouse holds no slice of batch %d's scope: it has no %s", v.BatchID, what)})
		return cli.ExitError{Code: cli.ExitNoLedger}
	case !st.Ref().Names(batch.Ref{ID: v.BatchID, UID: v.BatchUID}):
		flag := "--objects"
		if s.Errors {
			flag = "--errors"
		}
		why := fmt.Sprintf("the slice now belongs to batch %d, whose load replaced batch %d's slice and %s: see status --batch-id %d %s", st.BatchID, v.BatchID, what, st.BatchID, flag)
		if st.BatchID < v.BatchID {
			why = fmt.Sprintf("the slice belongs to batch %d: batch %d has not committed its load", st.BatchID, v.BatchID)
		}
		printJSON(e.Stdout, map[string]any{"outcome": outcomeSliceOfAnotherBatch, "batch_id": v.BatchID, "slice_batch_id": st.BatchID,
			"tenant_id": v.TenantID, "source_scope": v.SourceScope, "error": why})
		return cli.ExitError{Code: cli.ExitNoLedger}
	}
	head := sliceView{BatchID: v.BatchID, BatchUID: st.BatchUID, TenantID: v.TenantID, SourceScope: v.SourceScope,
		Generation: st.Generation, RecordCount: st.RecordCount, CommittedAt: st.CommittedAt, PublishedAt: st.PublishedAt,
		BadRecords: st.BadRecords}
	if s.Errors {
		head.Outcome = outcomeErrors
		ev := errorsView{sliceView: head, Errors: errs}
		if ev.Errors == nil {
			ev.Errors = []warehouse.LoadError{}
		}
		if s.JSON {
			printJSON(e.Stdout, ev)
			return nil
		}
		printLoadErrors(e.Stdout, ev)
		return nil
	}
	head.Outcome = outcomeLedger
	lv := ledgerView{sliceView: head, ObjectCount: int64(len(objects)), Objects: objects}
	if lv.Objects == nil {
		lv.Objects = []warehouse.LedgerObject{}
	}
	for _, o := range objects {
		lv.Bytes += o.SizeBytes
	}
	if s.JSON {
		printJSON(e.Stdout, lv)
		return nil
	}
	printLedger(e.Stdout, lv)
	return nil
}

// printLedger prints a load ledger for people; every text cell goes
// through inert (object keys come from outside).
func printLedger(w io.Writer, lv ledgerView) {
	bad := ""
	if lv.BadRecords > 0 {
		bad = fmt.Sprintf(", %d bad records skipped (status --errors lists them)", lv.BadRecords)
	}
	fmt.Fprintf(w, "batch %d, tenant %s, scope %s: %d objects, %d bytes, %d records%s; committed %s, %s\n",
		lv.BatchID, inert(lv.TenantID), inert(lv.SourceScope), lv.ObjectCount, lv.Bytes, lv.RecordCount, bad,
		lv.CommittedAt.UTC().Format(time.RFC3339), lv.published())
	if len(lv.Objects) > 0 {
		if m := lv.Objects[0].MarkerModified; m != nil {
			fmt.Fprintf(w, "marker modified %s\n", m.UTC().Format(time.RFC3339Nano))
		} else {
			fmt.Fprintln(w, "no marker")
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OBJECT\tETAG\tSIZE\tRECORDS\tLAST MODIFIED")
	for _, o := range lv.Objects {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", cell(o.ObjectKey), cell(o.ETag), o.SizeBytes, o.RecordCount, o.LastModified.UTC().Format(time.RFC3339Nano))
	}
	tw.Flush()
}

// printLoadErrors prints a slice's load errors for people; every text
// cell goes through cell (object keys, reasons and excerpts come from
// outside).
func printLoadErrors(w io.Writer, ev errorsView) {
	fmt.Fprintf(w, "batch %d, tenant %s, scope %s: %d records, %d bad records skipped; committed %s, %s\n",
		ev.BatchID, inert(ev.TenantID), inert(ev.SourceScope), ev.RecordCount, ev.BadRecords,
		ev.CommittedAt.UTC().Format(time.RFC3339), ev.published())
	if len(ev.Errors) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tOBJECT\tLINE\tCOLUMN\tREASON\tEXCERPT")
	for _, e := range ev.Errors {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\t%s\n", e.Ordinal, cell(e.ObjectKey), e.Line, e.Column, cell(e.Reason), oneLine(e.Excerpt, 120))
	}
	tw.Flush()
}

// watch redraws one progress line until the batch is terminal (or the
// command is interrupted). On a terminal the line is redrawn in place, cut
// to the terminal's width so it never wraps (a wrapped line would leave its
// first half behind at each redraw); otherwise, and with --json, a line is
// printed whenever it changes.
func (s *statusCmd) watch(e *cli.Env, v batchView, look func() (batchView, error)) error {
	width, tty := terminalWidth(e.Stdout)
	last := ""
	var rate rateMeter
	show := func(v batchView) {
		rate.estimate(&v)
		line := progressLine(v)
		if s.JSON {
			b, _ := json.Marshal(v)
			line = string(inertJSON(b))
		}
		switch {
		case tty && !s.JSON:
			fmt.Fprint(e.Stdout, redraw(line, width))
		case line != last:
			fmt.Fprintln(e.Stdout, line)
		}
		last = line
	}
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		show(v)
		if v.Status != string(batch.StatusRunning) {
			if tty && !s.JSON {
				fmt.Fprintln(e.Stdout)
			}
			return nil
		}
		select {
		case <-e.Ctx.Done():
			if tty && !s.JSON {
				fmt.Fprintln(e.Stdout)
			}
			return nil
		case <-t.C:
		}
		next, err := look()
		if err != nil {
			if e.Ctx.Err() != nil {
				return nil
			}
			return err
		}
		v = next
	}
}

// redraw returns what rewrites the current terminal line with line: back
// to its start, the line cut to width-1 columns (writing the last column
// leaves some terminals waiting to wrap), and the rest of the old line
// cleared.
func redraw(line string, width int) string {
	if width > 1 && utf8.RuneCountInString(line) > width-1 {
		r := []rune(line)
		line = string(r[:width-2]) + "…"
	}
	return "\r\033[K" + line
}

// rateMeter estimates a load's rate and time to finish from the progress
// status --watch has seen: the first progress of the current load and the
// latest, by the times the worker recorded them.
type rateMeter struct {
	first *batch.Progress
}

// estimate sets v's RecordsPerSecond and ETASeconds when the load has
// moved since the first progress seen. A load that starts over (fewer
// objects done than before, as after a redelivery) starts a new estimate.
func (m *rateMeter) estimate(v *batchView) {
	if v.ObjectsDone == nil || v.ProgressAt == nil || v.Status != string(batch.StatusRunning) {
		return
	}
	cur := batch.Progress{ObjectsDone: *v.ObjectsDone, ObjectsTotal: *v.ObjectsTotal, RecordsDone: *v.RecordsDone, At: *v.ProgressAt}
	if m.first == nil || cur.ObjectsDone < m.first.ObjectsDone || cur.RecordsDone < m.first.RecordsDone || cur.At.Before(m.first.At) {
		m.first = &cur
		return
	}
	elapsed := cur.At.Sub(m.first.At).Seconds()
	if elapsed <= 0 {
		return
	}
	records := float64(cur.RecordsDone-m.first.RecordsDone) / elapsed
	v.RecordsPerSecond = &records
	objects := float64(cur.ObjectsDone-m.first.ObjectsDone) / elapsed
	if objects > 0 && cur.ObjectsTotal >= cur.ObjectsDone {
		eta := float64(cur.ObjectsTotal-cur.ObjectsDone) / objects
		v.ETASeconds = &eta
	}
}

// progressLine is the one line status --watch redraws.
func progressLine(v batchView) string {
	var b strings.Builder
	fmt.Fprintf(&b, "batch %d %s", v.BatchID, v.Status)
	if v.Phase != "" {
		fmt.Fprintf(&b, " %s", v.Phase)
	}
	if v.Reason != "" {
		fmt.Fprintf(&b, " (%s)", v.Reason)
	}
	if v.ObjectsDone != nil {
		fmt.Fprintf(&b, ": %d/%d objects, %d records", *v.ObjectsDone, *v.ObjectsTotal, *v.RecordsDone)
	}
	if v.RecordsPerSecond != nil {
		fmt.Fprintf(&b, ", %.0f rec/s", *v.RecordsPerSecond)
	}
	if v.ETASeconds != nil {
		fmt.Fprintf(&b, ", ETA %s", (time.Duration(*v.ETASeconds * float64(time.Second))).Round(time.Second))
	}
	if v.RecordCount > 0 {
		fmt.Fprintf(&b, ", %d records committed", v.RecordCount)
	}
	if v.LeaseRenewedSecondsAgo != nil {
		fmt.Fprintf(&b, ", lease renewed %.1fs ago", *v.LeaseRenewedSecondsAgo)
	}
	if v.LeaseExpiresInSeconds != nil && v.LeaseHolder != "" {
		fmt.Fprintf(&b, ", expires in %.1fs", *v.LeaseExpiresInSeconds)
	}
	if v.Parked {
		fmt.Fprintf(&b, ", parked: %q", v.ParkedReason)
	}
	if v.LastError != "" && v.Status != string(batch.StatusRunning) {
		fmt.Fprintf(&b, ", last error: %q", oneLine(v.LastError, 120))
	}
	fmt.Fprintf(&b, ", age %s", (time.Duration(v.AgeSeconds * float64(time.Second))).Round(time.Second))
	if n := len(v.RiverJobs); n > 0 {
		fmt.Fprintf(&b, ", river job %d (%s)", v.RiverJobs[n-1].JobID, v.RiverJobs[n-1].State)
	}
	return b.String()
}

// terminalWidth reports whether w is a terminal and, if so, its width in
// columns (80 when it cannot be read).
func terminalWidth(w io.Writer) (int, bool) {
	if !isTerminal(w) {
		return 0, false
	}
	width, _, err := term.GetSize(int(w.(*os.File).Fd()))
	if err != nil || width <= 0 {
		width = 80
	}
	return width, true
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
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
	if l.Tenants {
		return l.listTenants(ctx, pool, e)
	}
	if l.paged() {
		return l.listPage(ctx, pool, e)
	}
	batches, now, err := batch.NewStore(pool).List(ctx, batch.ListFilter{
		Status: batch.Status(l.Status), TenantID: l.TenantID, Stuck: l.Stuck, Parked: l.Parked, Limit: l.Limit,
	})
	if err != nil {
		return err
	}
	views := make([]batchView, 0, len(batches))
	for _, b := range batches {
		views = append(views, view(b, now))
	}
	if err := addLinks(ctx, pool, views); err != nil {
		return err
	}
	if l.JSON {
		for _, v := range views {
			printJSON(e.Stdout, v)
		}
		return nil
	}
	l.print(e, views)
	return nil
}

// paged reports whether the listing is a page of one tenant's batches
// (batch.Store.Page): by folder or time, or continuing a page.
func (l *listCmd) paged() bool {
	return l.Folder != "" || l.Since != "" || l.Until != "" || l.Cursor != "" || l.Newest
}

// print prints views as the table asked for, or JSON lines.
func (l *listCmd) print(e *cli.Env, views []batchView) {
	switch {
	case l.JSON:
		for _, v := range views {
			printJSON(e.Stdout, v)
		}
	case l.Output == "wide":
		printTable(e.Stdout, views)
	default:
		printNarrowTable(e.Stdout, views)
	}
}

// listPage lists a page of one tenant's batches by folder and reservation
// time, newest first, and the cursor of the next page: the last JSON line
// {"next_cursor": …}, or a line on stderr under a table.
func (l *listCmd) listPage(ctx context.Context, pool *pgxpool.Pool, e *cli.Env) error {
	f := batch.PageFilter{TenantID: l.TenantID, Status: batch.Status(l.Status), Limit: l.Limit, Newest: l.Newest}
	if f.TenantID == "" {
		return invalid(e, &jobs.InputError{Field: "tenant_id", Reason: "--folder, --since, --until, --cursor and --newest list one tenant's batches: give --tenant-id"})
	}
	if l.Stuck || l.Parked {
		return invalid(e, &jobs.InputError{Field: "stuck", Reason: "--stuck and --parked do not combine with --folder, --since, --until, --cursor or --newest"})
	}
	if l.Limit > batch.MaxPageSize {
		return invalid(e, &jobs.InputError{Field: "limit", Reason: fmt.Sprintf("a page holds at most %d batches", batch.MaxPageSize)})
	}
	if l.Folder != "" {
		fo, err := folder.Canonicalize(l.Folder)
		if err != nil {
			return invalid(e, &jobs.InputError{Field: "folder", Reason: err.Error()})
		}
		f.SourceScope = fo.Scope()
	}
	var err error
	if f.Since, err = whenFlag(l.Since); err != nil {
		return invalid(e, &jobs.InputError{Field: "since", Reason: err.Error()})
	}
	if f.Until, err = whenFlag(l.Until); err != nil {
		return invalid(e, &jobs.InputError{Field: "until", Reason: err.Error()})
	}
	if l.Cursor != "" {
		c, err := batch.ParseCursor(l.Cursor)
		if err != nil {
			return invalid(e, &jobs.InputError{Field: "cursor", Reason: "not a cursor a page of this listing printed"})
		}
		f.After = &c
	}
	store := batch.NewStore(pool)
	page, next, err := store.Page(ctx, f)
	if err != nil {
		return err
	}
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return err
	}
	views := make([]batchView, 0, len(page))
	for _, b := range page {
		views = append(views, view(b, now))
	}
	if err := addLinks(ctx, pool, views); err != nil {
		return err
	}
	l.print(e, views)
	if next != nil {
		if l.JSON {
			printJSON(e.Stdout, map[string]string{"next_cursor": next.String()})
		} else {
			fmt.Fprintf(e.Stderr, "next page: --cursor %s\n", next.String())
		}
	}
	return nil
}

// whenFlag reads --since or --until: an RFC 3339 time, or a duration
// before now; empty is the zero time.
func whenFlag(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return at, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, errors.New("must be an RFC 3339 time (2026-12-03T10:00:00Z) or a duration before now (24h)")
	}
	return time.Now().Add(-d), nil
}

// printNarrowTable prints the columns that fit 100 characters: batch (10),
// tenant (12), status (9), phase with its reason (37: failed_pre_commit
// (folder_incomplete) whole), age (5) and the folder's end (15), two
// spaces apart.
func printNarrowTable(w io.Writer, views []batchView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tTENANT\tSTATUS\tPHASE\tAGE\tFOLDER")
	for _, v := range views {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n",
			cut(strconv.FormatInt(v.BatchID, 10), 10), oneLine(v.TenantID, 12), cell(v.Status), oneLine(phaseCell(v), 37),
			cut(shortAge(v.AgeSeconds), 5), tail(cell(strings.TrimPrefix(v.SourceScope, folder.ScopePrefix)), 15))
	}
	tw.Flush()
}

// cut is s in at most n characters.
func cut(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// tail is the end of s in at most n characters: a folder's last segments
// tell it apart.
func tail(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return "…" + string(r[len(r)-n+1:])
	}
	return s
}

// shortAge is an age in its largest unit: 45s, 12m, 5h, 3d.
func shortAge(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// printTable prints views as a table for people. Every text cell goes
// through inert: object names, error messages and lease holders come from
// outside (an S3 key can hold any byte) and must not drive the operator's
// terminal.
func printTable(w io.Writer, views []batchView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tTENANT\tSTATUS\tPHASE\tCOMMITTED\tPROGRESS\tLEASE HOLDER\tRENEWED\tLEASE EXPIRES IN\tGEN\tAGE\tRIVER JOBS\tRETRY\tSCOPE\tLAST ERROR")
	for _, v := range views {
		note := v.LastError + v.DetailsError
		if v.Parked {
			note = "parked: " + v.ParkedReason
		}
		if v.QueuePaused != "" {
			note = pausedNote(v)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n",
			v.BatchID, cell(v.TenantID), cell(v.Status), phaseCell(v), v.RedshiftCommitted, progressCell(v), cell(v.LeaseHolder),
			ago(v.LeaseRenewedSecondsAgo), secondsCell(v.LeaseExpiresInSeconds),
			v.LeaseGeneration, (time.Duration(v.AgeSeconds * float64(time.Second))).Round(time.Second),
			jobsCell(v.RiverJobs), retryCell(v), cell(v.SourceScope), oneLine(note, 60))
	}
	tw.Flush()
}

// phaseCell is the phase, with the failure's reason next to it when one is
// named: failed_pre_commit (folder_incomplete).
func phaseCell(v batchView) string {
	switch {
	case v.QueuePaused != "":
		return cell(v.Phase + " (queue paused)")
	case v.Reason == "":
		return cell(v.Phase)
	}
	return cell(v.Phase + " (" + v.Reason + ")")
}

// jobsCell lists River jobs as id:state, oldest first.
func jobsCell(refs []jobs.JobRef) string {
	if len(refs) == 0 {
		return "-"
	}
	parts := make([]string, len(refs))
	for i, j := range refs {
		parts[i] = fmt.Sprintf("%d:%s", j.JobID, j.State)
	}
	return cell(strings.Join(parts, ","))
}

// retryCell says which batch this one retries and which retry it.
func retryCell(v batchView) string {
	var parts []string
	if v.RetryOf != 0 {
		parts = append(parts, fmt.Sprintf("of %d", v.RetryOf))
	}
	if len(v.RetriedBy) > 0 {
		ids := make([]string, len(v.RetriedBy))
		for i, id := range v.RetriedBy {
			ids[i] = strconv.FormatInt(id, 10)
		}
		parts = append(parts, "by "+strings.Join(ids, ","))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

func progressCell(v batchView) string {
	if v.ObjectsDone == nil {
		return "-"
	}
	return fmt.Sprintf("%d/%d obj, %d rec", *v.ObjectsDone, *v.ObjectsTotal, *v.RecordsDone)
}

func ago(s *float64) string {
	if s == nil {
		return "-"
	}
	return secondsCell(s) + " ago"
}

func secondsCell(s *float64) string {
	if s == nil {
		return "-"
	}
	return (time.Duration(*s * float64(time.Second))).Round(100 * time.Millisecond).String()
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
