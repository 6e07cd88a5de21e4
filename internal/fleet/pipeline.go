// Package fleet is the Fleet import pipeline: it loads a canonical source
// folder into the warehouse slice of its tenant and scope, stamped with the
// batch id, then publishes it.
//
// Phases, each recorded durably in the batch details with a lease-fenced
// write before the step it announces:
//
//	reserved ─▶ loading ─▶ (warehouse commit) ─▶ committed, redshiftCommitted=true
//	         ─▶ publishing ─▶ (warehouse publication) ─▶ published (Succeeded)
//
// A delivery that has just committed records the commit together with the
// publishing phase, in one write (nothing happens between the two); a
// resumed batch starts from committed. With the local warehouse in the
// operational database (warehouse.WithRecord) fewer transactions commit:
// the loading phase commits with the lease acquisition (Start), the
// commit's record with the load itself and Succeeded with the publication
// itself (docs/reliability.md, Write transactions per batch).
//
// Each step is idempotent, so a delivery may start over from whatever phase
// a previous one recorded:
//
//   - Before loading, the warehouse stamp is read back. If the slice is
//     already stamped with this batch, a previous delivery committed and died
//     before recording it: the load is skipped and publication continues.
//     If it is stamped with a newer batch, this one is superseded. A
//     warehouse whose loads commit with their record (the local one,
//     warehouse.CommitRecorder) cannot be in the first case, and its load
//     reads the stamp in its own transaction for the second.
//   - A load replaces the whole slice in one warehouse transaction, so a
//     repeated load leaves exactly one copy of each record.
//   - Publication happens once per batch and only while the slice is still
//     stamped with it.
//
// Failures: anything that goes wrong before the warehouse commit and is not
// transient (unreadable or empty folder, malformed record, warehouse
// refusing the data) is failed_pre_commit, terminal: the previous slice is
// untouched and recovery is a new batch. After the commit, a non-transient
// publication error is failed_publication, which may be resumed; a slice
// replaced by a newer batch is superseded and a publication not completed
// within the window is publication_expired. Transient errors (see
// pipeline.IsTransient) leave the batch Running for a retry.
package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/drain"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/pipeline"
	"github.com/fleet/ingest/internal/warehouse"
)

// Pipeline loads and publishes Fleet batches.
type Pipeline struct {
	// Opener opens source folders.
	Opener folder.Opener
	// Warehouse receives the slices.
	Warehouse warehouse.Warehouse
	// PublicationWindow is how long after its commit a slice may still be
	// published. Defaults to batch.DefaultPublicationWindow (24 h).
	PublicationWindow time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics, if set, receives phase durations and records loaded.
	Metrics *metrics.Metrics
	// ProgressEvery is how often a running load's progress (objects and
	// records read so far) is recorded in the batch details, fenced on the
	// lease. Defaults to ProgressEveryDefault (5 s).
	ProgressEvery time.Duration
	// Mapping is this worker's own rule for which tenant an S3 folder
	// belongs to and which buckets it reads (folder.Mapping): Admit
	// re-checks every batch against it before a byte is read, whoever
	// wrote the batch row. The zero value is the default pattern and any
	// valid bucket name.
	Mapping folder.Mapping
	// AllowLocalFolders lets the worker read file:// and mem:// folders.
	// Development and tests only: a file:// batch reads a directory of the
	// worker's host into the warehouse. Without it such batches are parked.
	AllowLocalFolders bool
	// Marker is the completion marker a folder must hold, directly in it,
	// to be loaded: the object its producer writes last (Spark's and
	// Hadoop's _SUCCESS). A folder without it fails before any warehouse
	// write, failed_pre_commit with reason folder_incomplete, unless its
	// import opted out (batch.Details.MarkerOptional). Every door's batch
	// meets this rule here, where the folder is read. Defaults to
	// MarkerDefault.
	Marker string
	// PauseBeforePublication, tests only, pauses a delivery between its
	// warehouse commit (recorded: phase publishing) and its publication:
	// the window in which the chaos suite's faults find a committed,
	// unpublished batch.
	PauseBeforePublication time.Duration
}

// MarkerDefault is the default Pipeline.Marker.
const MarkerDefault = "_SUCCESS"

var _ pipeline.Admitter = (*Pipeline)(nil)

// Admit re-validates a batch before any work is done on it, so that a
// batch row written by any door — or directly by a database role that may
// insert batches — is worked only if this worker would have accepted it:
// its details name the folder of its scope (canonical: every path segment
// within the allow-list of batch.CheckPathSegment); its tenant, database
// and company ids pass the doors' own checks (batch.ValidateTenantID, …);
// the folder is an s3:// folder
// (file:// and mem:// only with AllowLocalFolders) of a bucket on the
// worker's allow-list; and the tenant, database and company of the batch
// are those the folder's path names under the worker's pattern. The error
// says why not; it names no host path.
func (p *Pipeline) Admit(b batch.Batch, d batch.Details) error {
	f, err := folder.Canonicalize(d.SourceFolder)
	if err != nil || f.Scope() != b.Scope() {
		return fmt.Errorf("the details' source folder does not name the batch's scope %q", b.Scope())
	}
	// The doors' own checks of the identifiers, for a row written before
	// them or by another writer.
	for _, err := range []error{batch.ValidateTenantID(b.TenantID), batch.ValidateTenantDatabase(b.TenantDatabase), batch.ValidateCompanyID(b.CompanyID)} {
		if err != nil {
			return fmt.Errorf("the batch's %w", err)
		}
	}
	if f.Scheme != folder.SchemeS3 {
		if p.AllowLocalFolders {
			return nil
		}
		return fmt.Errorf("%s:// folders are not read by this worker: only s3:// (worker run --dev-allow-local-folders is for development)", f.Scheme)
	}
	t, err := p.Mapping.Resolve(f)
	if err != nil {
		return err
	}
	for _, c := range []struct{ field, batch, path string }{
		{"tenant_id", b.TenantID, t.TenantID},
		{"tenant_database", b.TenantDatabase, t.TenantDatabase},
		{"company_id", b.CompanyID, t.CompanyID},
	} {
		if c.batch != c.path {
			return fmt.Errorf("the folder's path names %s %q, the batch %q: a folder is loaded only as its own tenant's", c.field, c.path, c.batch)
		}
	}
	return nil
}

// maxLateKeysLogged bounds the keys of late objects a load logs.
const maxLateKeysLogged = 20

// ProgressEveryDefault is the default Pipeline.ProgressEvery.
const ProgressEveryDefault = 5 * time.Second

func (p *Pipeline) observe(phase string, start time.Time) {
	if p.Metrics != nil {
		p.Metrics.PhaseDuration.WithLabelValues(phase).Observe(time.Since(start).Seconds())
	}
}

var _ pipeline.Pipeline = (*Pipeline)(nil)

// Execute implements pipeline.Pipeline.
func (p *Pipeline) Execute(ctx context.Context, run *pipeline.Run) error {
	logger := p.Logger
	if logger == nil {
		logger = slog.Default()
	}
	b, d := run.Batch, run.Details
	logger = logger.With("batch_id", b.ID, "tenant_id", b.TenantID, "lease_id", run.Lease.HolderID, "lease_generation", run.Lease.Generation)
	f, err := folder.Canonicalize(d.SourceFolder)
	if err != nil || f.Scope() != b.Scope() {
		return pipeline.Fail(batch.PhaseFailedPreCommit, fmt.Errorf("details folder %q does not match the batch scope %q", d.SourceFolder, b.Scope()))
	}
	slice := warehouse.Slice{TenantID: b.TenantID, SourceScope: b.Scope(), BatchID: b.ID, BatchUID: b.UID, Generation: run.Lease.Generation}

	recorded := false // the load's own transaction recorded the commit and the publishing phase
	if !d.RedshiftCommitted {
		// The stamp is read back first, unless the warehouse records its
		// commits with them (warehouse.CommitRecorder): then no slice is
		// stamped with this batch without its details saying so, and the
		// load reads the stamp itself, in its transaction.
		var (
			st    warehouse.Stamp
			found bool
		)
		if !recordsCommits(p.Warehouse) {
			if st, found, err = p.Warehouse.Stamp(ctx, slice.TenantID, slice.SourceScope); err != nil {
				return classify(batch.PhaseFailedPreCommit, err)
			}
		}
		if found && !st.Ref().Names(b.Ref()) {
			// Another batch's stamp: one the operational database does not
			// know is taken over, whatever its id.
			if err := p.takeOver(ctx, run, &slice, st.Ref(), st.Generation, logger); err != nil {
				return classify(batch.PhaseFailedPreCommit, err)
			}
		}
		switch {
		case found && st.Ref().Names(b.Ref()):
			logger.Info("warehouse commit found without a record of it: continuing from publication", "record_count", st.RecordCount)
		case found && warehouse.Supersedes(st, slice):
			return pipeline.Fail(batch.PhaseSuperseded, fmt.Errorf("warehouse slice is stamped with newer batch %s", st.Ref()))
		default:
			st, recorded, err = p.load(ctx, run, f, slice, logger)
			// A warehouse whose load reads the stamp itself (found is
			// false here) refuses another batch's stamp of a higher id: a
			// batch the operational database does not know is taken over
			// and the load tried again, once.
			var held *warehouse.SupersededError
			if errors.As(err, &held) && slice.TakeOver == nil && !held.Holder.Names(b.Ref()) {
				if terr := p.takeOver(ctx, run, &slice, held.Holder, held.Generation, logger); terr != nil {
					return classify(batch.PhaseFailedPreCommit, terr)
				}
				if slice.TakeOver != nil {
					st, recorded, err = p.load(ctx, run, f, slice, logger)
				}
			}
			if err != nil {
				return err
			}
		}
		// The commit is recorded with the publishing phase below: one
		// fenced write for both, or none when the load's own transaction
		// wrote it (the local warehouse, see load). A delivery that dies
		// before it finds the slice stamped with this batch and continues
		// from publication.
		d = committedDetails(run.Details, st)
	}

	if d.Publication.Completed {
		return nil
	}
	start := time.Now()
	if recorded {
		d = run.Details
	} else {
		d = publishingDetails(d, start)
		if err := run.Checkpoint(ctx, d); err != nil {
			return err
		}
	}
	window := p.PublicationWindow
	if window <= 0 {
		window = batch.DefaultPublicationWindow
	}
	// A warehouse in the operational database records the batch Succeeded
	// in the publication's own transaction (warehouse.WithRecord): the
	// publication and the terminal write commit together or not at all.
	var (
		done      *batch.Batch
		doneWith  batch.Details
		pubCtx    = warehouse.WithJournal(ctx, newJournal(run, nil))
		succeeded = func(ctx context.Context, tx pgx.Tx, st warehouse.Stamp) error {
			fd := publishedDetails(run.Details, st)
			b, err := run.SucceedTx(ctx, tx, fd)
			if err != nil {
				return err
			}
			done, doneWith = &b, fd
			return nil
		}
	)
	if p.PauseBeforePublication > 0 {
		logger.Warn("tests only: pausing between the warehouse commit and the publication", "pause_seconds", p.PauseBeforePublication.Seconds())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.PauseBeforePublication):
		}
	}
	st, err := p.Warehouse.Publish(warehouse.WithRecord(pubCtx, succeeded), slice, window, run.VerifyLease)
	switch {
	case errors.Is(err, batch.ErrStaleLease):
		return err
	case errors.Is(err, warehouse.ErrSliceSuperseded):
		return pipeline.Fail(batch.PhaseSuperseded, err)
	case errors.Is(err, warehouse.ErrPublicationExpired):
		return pipeline.Fail(batch.PhasePublicationExpired, err)
	case err != nil:
		return classify(batch.PhaseFailedPublication, err)
	}
	p.observe("publish", start)
	if done != nil {
		run.AdoptSucceeded(*done, doneWith)
	} else {
		run.Details = publishedDetails(run.Details, st) // the journal may have recorded and cleared a statement
	}
	logger.Info("batch published", "record_count", st.RecordCount, "publish_seconds", time.Since(start).Seconds())
	return nil
}

// takeOver decides what a load does with holder's stamp on the slice, a
// batch other than this one: a batch the operational database knows keeps
// its stamp (newer: superseded; older: replaced as always); one it does not
// know was forgotten (a restore from a backup, a failover to a standby
// that was behind) and its stamp is taken over (slice.TakeOver), whatever
// its id: counted (ingest_forgotten_stamps_total), logged with both
// batches' identities, recorded in the details committed with the load
// (Details.TookOver, which enqueue status shows), and the batches' id
// sequence moved past its id so no new batch is handed it again.
func (p *Pipeline) takeOver(ctx context.Context, run *pipeline.Run, slice *warehouse.Slice, holder batch.Ref, generation int64, logger *slog.Logger) error {
	known, err := run.Knows(ctx, holder)
	if err != nil || known {
		return err
	}
	slice.TakeOver = &holder
	run.Details.TookOver = &batch.TakenOver{BatchID: holder.ID, BatchUID: holder.UID, Generation: generation, At: time.Now().UTC()}
	if p.Metrics != nil {
		p.Metrics.ForgottenStamps.Inc()
	}
	logger.Warn("the warehouse slice is stamped with a batch the operational database does not know (forgotten by a restore or a failover behind the warehouse): this batch takes it over",
		"forgotten_batch_id", holder.ID, "forgotten_batch_uid", holder.UID, "forgotten_lease_generation", generation,
		"batch_uid", run.Batch.UID, "folder", slice.SourceScope)
	if last, err := run.AdvanceIDs(ctx, holder.ID); err != nil {
		logger.Warn("could not move the batch id sequence past the forgotten batch's id (worker migrate does): new batches may be handed ids the warehouse names",
			"forgotten_batch_id", holder.ID, "error", err)
	} else {
		logger.Info("batch id sequence past the forgotten batch's id", "forgotten_batch_id", holder.ID, "sequence_last_value", last)
	}
	return nil
}

// recordsCommits reports whether w's loads commit with the caller's
// record of them (warehouse.CommitRecorder).
func recordsCommits(w warehouse.Warehouse) bool {
	r, ok := w.(warehouse.CommitRecorder)
	return ok && r.RecordsCommits()
}

// committedDetails is d recording the warehouse commit st.
func committedDetails(d batch.Details, st warehouse.Stamp) batch.Details {
	d.Phase, d.RedshiftCommitted, d.RecordCount = batch.PhaseCommitted, true, st.RecordCount
	d.WarehouseStatement = nil // the load's statement ended: the slice is stamped
	committedAt := st.CommittedAt
	d.CommittedAt = &committedAt
	return d
}

// publishingDetails is d announcing the publication, started at start.
func publishingDetails(d batch.Details, start time.Time) batch.Details {
	d.Phase, d.Publication.Started = batch.PhasePublishing, true
	startedAt := start.UTC()
	d.Publication.StartedAt = &startedAt
	return d
}

// publishedDetails is d recording the completed publication st.
func publishedDetails(d batch.Details, st warehouse.Stamp) batch.Details {
	d.Phase, d.Publication.Completed, d.Publication.CompletedAt = batch.PhasePublished, true, st.PublishedAt
	d.WarehouseStatement = nil
	return d
}

var _ pipeline.Settler = (*Pipeline)(nil)

// Settle implements pipeline.Settler: a batch whose details do not record a
// warehouse commit is checked against the warehouse stamp, never assumed
// uncommitted; a slice stamped with the batch is recorded as its commit.
//
// A batch whose details record a warehouse statement that may still commit
// (a load's or a publication's, see warehouse.StatementWatcher) is not
// settled: Settle returns an error, and the batch stays Running for a
// later delivery, which follows that statement to its end.
func (p *Pipeline) Settle(ctx context.Context, b batch.Batch, d batch.Details) (batch.Details, error) {
	if ws := d.WarehouseStatement; ws != nil {
		if sw, ok := p.Warehouse.(warehouse.StatementWatcher); ok {
			st := warehouse.Statement{Kind: ws.Kind, ID: ws.ID, Generation: ws.Generation, Attempt: ws.Attempt, Records: ws.Records}
			ended, err := sw.StatementEnded(ctx, st)
			if err != nil {
				return d, err
			}
			if !ended {
				return d, fmt.Errorf("warehouse statement %q (%s, generation %d) may still commit", ws.ID, ws.Kind, ws.Generation)
			}
		}
	}
	if d.RedshiftCommitted {
		return d, nil
	}
	st, found, err := p.Warehouse.Stamp(ctx, b.TenantID, b.Scope())
	if err != nil {
		return d, err
	}
	if found && st.Ref().Names(b.Ref()) {
		committedAt := st.CommittedAt
		d.Phase, d.RedshiftCommitted, d.RecordCount, d.CommittedAt = batch.PhaseCommitted, true, st.RecordCount, &committedAt
	}
	return d, nil
}

var _ pipeline.PhaseStarter = (*Pipeline)(nil)

// StartPhases implements pipeline.PhaseStarter: a reserved batch starts
// loading (Start), which the lease acquisition records itself.
func (p *Pipeline) StartPhases() (from, to batch.Phase) {
	return batch.PhaseReserved, batch.PhaseLoading
}

// Start implements pipeline.Starter: a batch whose details record no
// warehouse commit and no loading phase yet is recorded loading in the
// acquisition's own transaction, so load need not write it (the phase is
// durable, under this delivery's lease, before anything is read). From
// reserved, the acquisition's UPDATE records it itself (StartPhases).
func (p *Pipeline) Start(_ batch.Batch, d batch.Details) (batch.Details, bool) {
	if d.RedshiftCommitted || d.Phase == batch.PhaseLoading {
		return d, false
	}
	d.Phase = batch.PhaseLoading
	return d, true
}

// load records the loading phase and loads the folder into the slice.
//
// A warehouse in the operational database records the commit, with the
// publishing phase, in the load's own transaction (warehouse.WithRecord):
// recorded is then true and run.Details is what it wrote.
func (p *Pipeline) load(ctx context.Context, run *pipeline.Run, f folder.Folder, slice warehouse.Slice, logger *slog.Logger) (_ warehouse.Stamp, recorded bool, _ error) {
	if d := run.Details; d.Phase != batch.PhaseLoading {
		// Not recorded at the acquisition (pipeline.Begin) nor by an
		// earlier delivery: record it now, before the folder is read.
		d.Phase = batch.PhaseLoading
		if err := run.Checkpoint(ctx, d); err != nil {
			return warehouse.Stamp{}, false, err
		}
	}
	src, err := p.Opener.Open(ctx, f)
	if err != nil {
		return warehouse.Stamp{}, false, classify(batch.PhaseFailedPreCommit, err)
	}
	defer src.Close()
	listing, err := src.List(ctx)
	if err != nil {
		return warehouse.Stamp{}, false, classify(batch.PhaseFailedPreCommit, err)
	}
	objects, marker := listing.Objects, cmp.Or(p.Marker, MarkerDefault)
	summary := folder.Summarize(listing, marker)
	if summary.Marker == "" && !run.Details.MarkerOptional {
		return warehouse.Stamp{}, false, pipeline.FailBecause(batch.PhaseFailedPreCommit, batch.ReasonFolderIncomplete,
			fmt.Errorf("folder %s holds no completion marker %q (%d data objects): it is loaded once its producer writes the marker; a producer that writes none is imported with the marker opt-out (\"no_marker\": true in an HTTP import, enqueue import --no-marker)", f, marker, len(objects)))
	}
	if summary.Late > 0 {
		late := folder.Late(listing, marker)
		logger.Warn("objects modified after the folder's completion marker: loaded with it, as listed", "late", summary.Late,
			"marker_modified", summary.MarkerModified, "keys", late[:min(len(late), maxLateKeysLogged)])
		if p.Metrics != nil {
			p.Metrics.LateObjects.Add(float64(summary.Late))
		}
	}
	if summary.MarkerModified != nil {
		slice.MarkerModified = *summary.MarkerModified
	}
	src.Tolerate(run.Details.MaxBadRecords)
	start := time.Now()
	logger.Info("loading folder", "folder", f.String(), "objects", len(objects), "bytes", summary.Bytes, "marker", summary.Marker != "")
	var (
		details sync.Mutex // the sampler, the journal and the record all write run.Details
		closed  bool       // set under details by the record: the sampler writes no more
		wrote   *batch.Batch
		wroteD  batch.Details
	)
	prog := src.Progress()
	// A draining worker waits for this load if its progress says it will
	// finish in time (drain.Tracker).
	drain.Report(ctx, func() (int64, int64) { return prog.Objects(), int64(len(objects)) })
	stop := p.sampleProgress(ctx, run, &details, &closed, prog, int64(len(objects)), logger)
	record := func(ctx context.Context, tx pgx.Tx, st warehouse.Stamp) error {
		details.Lock()
		defer details.Unlock()
		// No progress sample may land after this write commits (it would
		// write the loading phase back): the sampler stops here, and a
		// sample in flight finished before the lock was ours.
		closed = true
		d := run.Details
		d.Progress = &batch.Progress{ObjectsDone: prog.Objects(), ObjectsTotal: int64(len(objects)), RecordsDone: prog.Records(), At: time.Now().UTC()}
		d = publishingDetails(committedDetails(d, st), time.Now())
		summary.BadRecords = st.BadRecords
		d.Objects = &summary
		b, err := run.CheckpointTx(ctx, tx, d)
		if err != nil {
			return err
		}
		wrote, wroteD = &b, d
		return nil
	}
	lctx := warehouse.WithRecord(warehouse.WithJournal(ctx, newJournal(run, &details)), record)
	st, err := p.Warehouse.Load(lctx, slice, src, objects, run.VerifyLease)
	final := stop()
	switch {
	case errors.Is(err, batch.ErrStaleLease):
		return warehouse.Stamp{}, false, err
	case errors.Is(err, warehouse.ErrSliceSuperseded):
		return warehouse.Stamp{}, false, pipeline.Fail(batch.PhaseSuperseded, err)
	case err != nil:
		return warehouse.Stamp{}, false, classify(batch.PhaseFailedPreCommit, err)
	}
	p.observe("load", start)
	if wrote != nil {
		wroteD.Progress = &final
		run.Adopt(*wrote, wroteD)
	} else {
		run.Details.Progress = &final
		summary.BadRecords = st.BadRecords
		run.Details.Objects = &summary // recorded with the commit by the caller's checkpoint
	}
	if st.BadRecords > 0 {
		logger.Warn("bad records skipped within the import's tolerance: each is in the warehouse's errors table with the slice",
			"bad_records", st.BadRecords, "max_bad_records", run.Details.MaxBadRecords)
	}
	logger.Info("warehouse slice committed", "record_count", st.RecordCount, "load_seconds", time.Since(start).Seconds())
	return st, wrote != nil, nil
}

// sampleProgress records the load's progress in the batch details every
// ProgressEvery while the load runs, and counts records loaded. The returned
// stop ends the sampling (waiting for a write in flight) and returns the
// final figures. A failed write is not the load's business: a lost lease
// stops the load through its own lease checks; anything else is logged.
func (p *Pipeline) sampleProgress(ctx context.Context, run *pipeline.Run, details *sync.Mutex, closed *bool, prog *folder.Progress, objects int64, logger *slog.Logger) (stop func() batch.Progress) {
	every := p.ProgressEvery
	if every <= 0 {
		every = ProgressEveryDefault
	}
	var counted int64
	sample := func() batch.Progress {
		bp := batch.Progress{ObjectsDone: prog.Objects(), ObjectsTotal: objects, RecordsDone: prog.Records(), At: time.Now().UTC()}
		if p.Metrics != nil && bp.RecordsDone > counted {
			p.Metrics.RecordsLoaded.Add(float64(bp.RecordsDone - counted))
		}
		counted = bp.RecordsDone
		return bp
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		var last batch.Progress
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			bp := sample()
			if bp.RecordsDone == last.RecordsDone && bp.ObjectsDone == last.ObjectsDone {
				continue
			}
			last = bp
			details.Lock()
			if *closed {
				details.Unlock()
				return
			}
			d := run.Details
			d.Progress = &bp
			err := run.Checkpoint(ctx, d)
			details.Unlock()
			if err != nil {
				if !errors.Is(err, batch.ErrStaleLease) && ctx.Err() == nil {
					logger.Warn("recording load progress failed", "error", err)
				}
				if errors.Is(err, batch.ErrStaleLease) {
					return
				}
			}
		}
	}()
	return func() batch.Progress {
		close(done)
		<-finished
		return sample()
	}
}

// journal keeps the warehouse's statement record in the batch details
// (warehouse.Journal): each record is a fenced checkpoint, so only the
// lease holder records, and it is durable before the statement is awaited.
type journal struct {
	run *pipeline.Run
	mu  *sync.Mutex
}

func newJournal(run *pipeline.Run, mu *sync.Mutex) *journal {
	if mu == nil {
		mu = new(sync.Mutex)
	}
	return &journal{run: run, mu: mu}
}

// Pending implements warehouse.Journal.
func (j *journal) Pending() (warehouse.Statement, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	ws := j.run.Details.WarehouseStatement
	if ws == nil {
		return warehouse.Statement{}, false
	}
	return warehouse.Statement{Kind: ws.Kind, ID: ws.ID, Generation: ws.Generation, Attempt: ws.Attempt, Records: ws.Records}, true
}

// Record implements warehouse.Journal.
func (j *journal) Record(ctx context.Context, st warehouse.Statement) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	d := j.run.Details
	if st == (warehouse.Statement{}) {
		if d.WarehouseStatement == nil {
			return nil
		}
		d.WarehouseStatement = nil
	} else {
		d.WarehouseStatement = &batch.WarehouseStatement{Kind: st.Kind, ID: st.ID, Generation: st.Generation,
			Attempt: st.Attempt, Records: st.Records, SubmittedAt: time.Now().UTC()}
	}
	return j.run.Checkpoint(ctx, d)
}

// classify returns err itself when it is transient, otherwise a Failure
// recording phase (with reason bad_records for a bad record the import did
// not tolerate).
func classify(phase batch.Phase, err error) error {
	if pipeline.IsTransient(err) || errors.Is(err, context.Canceled) {
		return err
	}
	if _, bad := folder.AsBadRecord(err); bad {
		return pipeline.FailBecause(phase, batch.ReasonBadRecords, err)
	}
	return pipeline.Fail(phase, err)
}
