package redshift

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/warehouse"
)

// Warehouse is the production warehouse: schema curated in Amazon Redshift,
// reached through the Redshift Data API, loaded by server-side COPY from
// staging objects in S3. It is safe for concurrent use.
type Warehouse struct {
	dataAPI
	s3     *s3.Client
	chunks sync.Pool // upload buffers of UploadPartBytes
	bucket string
	prefix string
}

var _ warehouse.Warehouse = (*Warehouse)(nil)

// Open returns the warehouse cfg describes, with AWS clients from the
// standard configuration chain (environment, shared files, web identity,
// instance or task role; AWS_REGION; endpoint overrides such as
// AWS_ENDPOINT_URL_REDSHIFT_DATA and AWS_ENDPOINT_URL_S3).
func Open(ctx context.Context, cfg Config) (*Warehouse, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	awsCfg, err := loadAWS(ctx)
	if err != nil {
		return nil, err
	}
	return New(cfg, redshiftdata.NewFromConfig(awsCfg), s3.NewFromConfig(awsCfg))
}

// loadAWS loads the standard AWS configuration and insists on a region.
func loadAWS(ctx context.Context) (aws.Config, error) {
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("loading AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return aws.Config{}, &ConfigError{Field: "region", Reason: "no AWS region: set AWS_REGION (or a profile's region)"}
	}
	return awsCfg, nil
}

// New returns the warehouse cfg describes on the given clients.
func New(cfg Config, data *redshiftdata.Client, s3Client *s3.Client) (*Warehouse, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	bucket, prefix, _ := ParseStaging(cfg.Staging)
	return &Warehouse{dataAPI: dataAPI{cfg: cfg, data: data}, s3: s3Client, bucket: bucket, prefix: prefix}, nil
}

func checkSlice(s warehouse.Slice) error {
	if s.TenantID == "" || s.SourceScope == "" || s.BatchID <= 0 || s.Generation < 0 {
		return fmt.Errorf("invalid warehouse slice %+v", s)
	}
	return nil
}

// superseded is the error of a load or publication of s that finds the
// slice held by cur (warehouse.Supersedes).
func superseded(cur warehouse.Stamp) error {
	return &warehouse.SupersededError{Holder: cur.Ref(), Generation: cur.Generation}
}

// Load implements warehouse.Warehouse.
//
// It reads the stamp first and refuses a slice a newer batch or generation
// holds before staging anything. It then stages the records (gzip NDJSON
// parts and a manifest under batch-{id}/gen-{generation}/) and runs two
// transactions:
//
//   - the COPY, into the load's own staging table
//     (curated_staging.fleet_load_{batch}_{generation}); it takes no shared
//     lock and writes nothing shared, so however long it runs no other
//     tenant's load or publication waits on it;
//   - the swap, after beforeCommit (the lease check, also called before
//     the COPY): under the writer
//     lock, guard against a newer stamp, delete the slice, INSERT … SELECT
//     the staged rows, check the count, replace the stamp, drop the staging
//     table.
//
// A transient failure of either (Redshift's 1023 serializable isolation
// violation, its snapshot-isolation conflict, an aborted statement) is
// retried with backoff within this call, from the same staging: nothing is
// staged twice. Each transaction is awaited for LoadTimeout.
//
// Commit detection reads the stamp back. Whenever the swap failed, was
// aborted, or was not seen to end, the stamp decides: stamped with this
// batch means committed (by this load or an earlier generation of the same
// batch), stamped with a newer batch or generation means
// ErrSliceSuperseded; otherwise the statement's failure is returned, or,
// when its outcome is unknown, an error wrapping warehouse.ErrTransient (the
// statement may still commit; the next delivery reads the stamp before
// loading again). When ctx ends while a transaction runs (the lease was
// lost or the worker is stopping) the statement is cancelled, best effort.
//
// Residual window: beforeCommit runs before the swap is submitted, not at
// its commit, which happens on the server. A delivery that loses its lease
// while its swap runs, and cannot cancel it (a paused or partitioned
// worker), may still commit. Such a commit loads the same batch's folder and
// is stamped with its older generation: a newer generation's load replaces
// it, or, if the newer one committed first, the guard refuses it.
func (w *Warehouse) Load(ctx context.Context, s warehouse.Slice, src *folder.Source, objects []folder.Object, beforeCommit func(context.Context) error) (warehouse.Stamp, error) {
	if err := checkSlice(s); err != nil {
		return warehouse.Stamp{}, err
	}
	v, err := sliceValues(s)
	if err != nil {
		return warehouse.Stamp{}, fmt.Errorf("batch %d: %w", s.BatchID, err)
	}
	log := w.cfg.Logger.With("batch_id", s.BatchID, "tenant_id", s.TenantID, "lease_generation", s.Generation)
	j := warehouse.JournalFrom(ctx)
	followed, err := w.follow(ctx, s, j)
	if err != nil {
		return warehouse.Stamp{}, err
	}
	cur, _, found, err := w.stamp(ctx, s.TenantID, s.SourceScope)
	if err != nil {
		return warehouse.Stamp{}, err
	}
	if found && warehouse.Supersedes(cur, s) {
		return warehouse.Stamp{}, superseded(cur)
	}
	if followed && found && cur.Ref().Names(s.Ref()) {
		return w.settleLoad(ctx, s, nil) // the followed statement committed it
	}

	rr := src.Records(ctx, objects)
	rr.RefuseNumbers(refuseDouble)
	ledger := warehouse.NewLedgerCounter(s, src, objects)
	st, err := w.stage(ctx, s, rr, ledger)
	rr.Close()
	var ledgerURL, errorsURL string
	if err == nil {
		ledgerURL, err = w.stageLedger(ctx, s, ledger.Objects())
	}
	if err == nil {
		errorsURL, err = w.stageErrors(ctx, s, warehouse.LoadErrors(s, rr.Bad()))
	}
	if err != nil {
		w.deleteStaging(ctx, s.BatchID, s.Generation)
		return warehouse.Stamp{}, err
	}
	log.Info("load staged", "records", st.Records, "objects", len(objects), "parts", st.Parts, "bytes", st.Bytes, "compressed_bytes", st.Compressed,
		"bad_records", len(rr.Bad()), "manifest", st.ManifestURL, "ledger_manifest", ledgerURL, "errors_manifest", errorsURL)

	staged := st.ManifestURL != ""
	sub := submission{slice: s, records: st.Records, timeout: w.cfg.LoadTimeout, poll: w.cfg.LoadPollInterval, pollMax: w.cfg.LoadPollMax,
		before: beforeCommit, journal: j}
	// The lease is checked before the COPY too: a delivery that lost it
	// does not start one.
	copySub := sub
	copySub.kind, copySub.name, copySub.sqls = kindLoadCopy, loadName("copy", s), stageSQL(s, st.ManifestURL, ledgerURL, errorsURL, w.cfg.IAMRole)
	start := time.Now()
	id, err := w.run(ctx, copySub)
	if err != nil {
		return w.loadFailed(ctx, s, id, err)
	}
	log.Info("load copied into its staging tables", "statement_id", id, "table", stagingTable(s), "ledger_table", ledgerStagingTable(s),
		"errors_table", errorsStagingTable(s),
		"copy_seconds", time.Since(start).Seconds())
	sub.kind, sub.name, sub.sqls = kindLoadSwap, loadName("swap", s), swapSQL(s, v, st.Records, staged)
	id, err = w.run(ctx, sub)
	if err != nil {
		return w.loadFailed(ctx, s, id, err)
	}
	return w.settleLoad(ctx, s, nil)
}

// loadFailed settles a load whose transaction (the COPY or the swap) did
// not finish as expected: cancelled, failed, or not seen to
// end. id is the statement, if one was submitted.
func (w *Warehouse) loadFailed(ctx context.Context, s warehouse.Slice, id string, err error) (warehouse.Stamp, error) {
	var se *StatementError
	switch {
	case ctx.Err() != nil:
		return warehouse.Stamp{}, fmt.Errorf("load of batch %d cancelled; the stamp tells whether statement %s committed: %w", s.BatchID, id, err)
	case errors.As(err, &se), !errors.Is(err, errOutcomeUnknown) && id == "":
		// The transaction ended (or was never run): its staging is garbage
		// unless the stamp shows the batch committed, which cleans it too.
		stamp, serr := w.settleLoad(ctx, s, err)
		if serr != nil {
			w.deleteStaging(ctx, s.BatchID, s.Generation)
			w.dropStagingTable(ctx, s)
		}
		return stamp, serr
	default:
		// The outcome is unknown: the statement may still run, and may
		// still commit. Its staging stays for it.
		return w.settleLoad(ctx, s, err)
	}
}

// dropStagingTable drops a load's staging tables (records, ledger and
// errors) once its load can no longer use them. Failures are logged.
func (w *Warehouse) dropStagingTable(ctx context.Context, s warehouse.Slice) {
	ctx, done := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer done()
	if err := w.exec(ctx, fmt.Sprintf("fleet-load-drop-%d-%d", s.BatchID, s.Generation),
		[]string{`DROP TABLE IF EXISTS ` + stagingTable(s), `DROP TABLE IF EXISTS ` + ledgerStagingTable(s), `DROP TABLE IF EXISTS ` + errorsStagingTable(s)}); err != nil {
		w.cfg.Logger.Warn("dropping staging table", "batch_id", s.BatchID, "table", stagingTable(s), "ledger_table", ledgerStagingTable(s), "error", err)
	}
}

// settleLoad reads the stamp to learn a load's outcome. cause is why the
// load's own view is not enough (nil after FINISHED).
func (w *Warehouse) settleLoad(ctx context.Context, s warehouse.Slice, cause error) (warehouse.Stamp, error) {
	cur, _, found, err := w.stamp(ctx, s.TenantID, s.SourceScope)
	switch {
	case err != nil && cause != nil:
		return warehouse.Stamp{}, fmt.Errorf("%w: %w (and the stamp could not be read: %v)", warehouse.ErrTransient, cause, err)
	case err != nil:
		return warehouse.Stamp{}, fmt.Errorf("%w: load finished but its stamp could not be read: %w", warehouse.ErrTransient, err)
	case found && warehouse.Supersedes(cur, s):
		return warehouse.Stamp{}, superseded(cur)
	case found && cur.Ref().Names(s.Ref()):
		if cause != nil {
			w.cfg.Logger.Warn("load committed although its client saw it fail or did not see it end",
				"batch_id", s.BatchID, "lease_generation", s.Generation, "stamp_generation", cur.Generation, "cause", cause)
		}
		w.deleteStaging(ctx, s.BatchID, cur.Generation)
		return cur, nil
	case cause != nil:
		return warehouse.Stamp{}, cause
	default:
		return warehouse.Stamp{}, fmt.Errorf("%w: load of batch %d finished but the slice is not stamped with it", warehouse.ErrTransient, s.BatchID)
	}
}

// Stamp implements warehouse.Warehouse (and warehouse.StampReader for
// Stamps).
func (w *dataAPI) Stamp(ctx context.Context, tenantID, sourceScope string) (warehouse.Stamp, bool, error) {
	st, _, found, err := w.stamp(ctx, tenantID, sourceScope)
	return st, found, err
}

// stamp reads the slice's stamp and its age in seconds on the warehouse
// clock.
func (w *dataAPI) stamp(ctx context.Context, tenantID, sourceScope string) (warehouse.Stamp, int64, bool, error) {
	v, err := sliceValues(warehouse.Slice{TenantID: tenantID, SourceScope: sourceScope})
	if err != nil {
		return warehouse.Stamp{}, 0, false, fmt.Errorf("reading warehouse stamp: %w", err)
	}
	rows, err := w.query(ctx, "fleet-stamp", render(readStamp, v))
	if err != nil {
		return warehouse.Stamp{}, 0, false, fmt.Errorf("reading warehouse stamp: %w", err)
	}
	switch {
	case len(rows) == 0:
		return warehouse.Stamp{}, 0, false, nil
	case len(rows) > 1:
		return warehouse.Stamp{}, 0, false, fmt.Errorf("reading warehouse stamp: the slice has %d stamps", len(rows))
	case len(rows[0]) != 8:
		return warehouse.Stamp{}, 0, false, fmt.Errorf("reading warehouse stamp: %d columns", len(rows[0]))
	}
	r := rows[0]
	var (
		st   warehouse.Stamp
		age  int64
		errs [8]error
		at   *time.Time
	)
	st.BatchID, errs[0] = fieldInt(r[0])
	st.Generation, errs[1] = fieldInt(r[1])
	st.RecordCount, errs[2] = fieldInt(r[2])
	at, errs[3] = fieldTime(r[3])
	st.PublishedAt, errs[4] = fieldTime(r[4])
	age, errs[5] = fieldInt(r[5])
	st.BadRecords, errs[6] = fieldInt(r[6])
	st.BatchUID, errs[7] = fieldString(r[7])
	if err := errors.Join(errs[:]...); err != nil {
		return warehouse.Stamp{}, 0, false, fmt.Errorf("reading warehouse stamp: %w", err)
	}
	if at == nil {
		return warehouse.Stamp{}, 0, false, errors.New("reading warehouse stamp: no commit time")
	}
	st.CommittedAt = *at
	return st, age, true, nil
}

// Publish implements warehouse.Warehouse.
//
// It reads the stamp first (missing, superseded, expired on the warehouse
// clock, or already published), then calls beforeCommit (the lease check)
// and submits one transaction: lock, guard (stamped with this batch and
// published or within the window), stamp published_at, append the outbox
// row unless the batch has one. The lock is held only by other
// publications and loads' swaps, never through a COPY. A transient
// conflict is retried with backoff. The stamp read back is the outcome.
// The residual window of Load applies: beforeCommit runs before
// submission. A stale holder's publication that slips through it publishes
// the batch the slice is stamped with, once: it cannot publish another
// batch's data or publish twice.
//
// Once published, the batch's staging objects of this and older
// generations are deleted.
func (w *Warehouse) Publish(ctx context.Context, s warehouse.Slice, window time.Duration, beforeCommit func(context.Context) error) (warehouse.Stamp, error) {
	if err := checkSlice(s); err != nil {
		return warehouse.Stamp{}, err
	}
	v, err := sliceValues(s)
	if err != nil {
		return warehouse.Stamp{}, fmt.Errorf("batch %d: %w", s.BatchID, err)
	}
	j := warehouse.JournalFrom(ctx)
	if _, err := w.follow(ctx, s, j); err != nil {
		return warehouse.Stamp{}, err
	}
	cur, age, found, err := w.stamp(ctx, s.TenantID, s.SourceScope)
	if err != nil {
		return warehouse.Stamp{}, err
	}
	if err := publishable(cur, age, found, s, window); err != nil {
		return warehouse.Stamp{}, err
	}
	if cur.PublishedAt != nil {
		if beforeCommit != nil {
			if err := beforeCommit(ctx); err != nil {
				return warehouse.Stamp{}, err
			}
		}
		w.deleteStaging(ctx, s.BatchID, s.Generation)
		return cur, nil
	}
	seconds := max(int64(window/time.Second), 1)
	_, cause := w.run(ctx, submission{
		kind: kindPublish, name: fmt.Sprintf("fleet-publish-%d-%d", s.BatchID, s.Generation), sqls: publishSQL(v, seconds),
		slice: s, timeout: w.cfg.QueryTimeout, poll: w.cfg.PollInterval, pollMax: w.cfg.PollMax, before: beforeCommit, journal: j,
	})
	var refused *beforeCommitError
	if errors.As(cause, &refused) {
		return warehouse.Stamp{}, refused.err
	}
	if cause != nil && ctx.Err() != nil {
		return warehouse.Stamp{}, cause
	}
	cur, age, found, err = w.stamp(ctx, s.TenantID, s.SourceScope)
	switch {
	case err != nil && cause != nil:
		return warehouse.Stamp{}, fmt.Errorf("%w: %w (and the stamp could not be read: %v)", warehouse.ErrTransient, cause, err)
	case err != nil:
		return warehouse.Stamp{}, fmt.Errorf("%w: publication finished but its stamp could not be read: %w", warehouse.ErrTransient, err)
	case found && cur.Ref().Names(s.Ref()) && cur.PublishedAt != nil:
		w.deleteStaging(ctx, s.BatchID, s.Generation)
		return cur, nil
	}
	if err := publishable(cur, age, found, s, window); err != nil {
		return warehouse.Stamp{}, err
	}
	if cause == nil {
		cause = fmt.Errorf("%w: publication of batch %d finished but the slice is not published", warehouse.ErrTransient, s.BatchID)
	}
	return warehouse.Stamp{}, cause
}

// publishable explains why a slice cannot be published by s, or nil.
func publishable(cur warehouse.Stamp, age int64, found bool, s warehouse.Slice, window time.Duration) error {
	switch {
	case !found:
		return warehouse.ErrSliceMissing
	case !cur.Ref().Names(s.Ref()):
		return superseded(cur)
	case cur.PublishedAt == nil && time.Duration(age)*time.Second > window:
		return fmt.Errorf("%w: committed at %s", warehouse.ErrPublicationExpired, cur.CommittedAt.Format(time.RFC3339))
	}
	return nil
}

var _ warehouse.IDBound = (*dataAPI)(nil)

// MaxBatchID implements warehouse.IDBound: one statement.
func (w *dataAPI) MaxBatchID(ctx context.Context, everyTable bool) (int64, error) {
	v := values{"every_table": "0"}
	if everyTable {
		v["every_table"] = "1"
	}
	rows, err := w.query(ctx, "fleet-max-batch-id", render(maxBatchID, v))
	if err != nil {
		return 0, fmt.Errorf("reading the largest batch id the warehouse names: %w", err)
	}
	if len(rows) != 1 || len(rows[0]) != 1 {
		return 0, fmt.Errorf("reading the largest batch id the warehouse names: %d rows", len(rows))
	}
	id, err := fieldInt(rows[0][0])
	if err != nil {
		return 0, fmt.Errorf("reading the largest batch id the warehouse names: %w", err)
	}
	return id, nil
}
