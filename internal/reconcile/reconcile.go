// Package reconcile finds every completed folder of a bucket that has no
// batch — an upload whose notification was lost — and enqueues it, and
// every published folder whose objects changed since its load, and
// imports it again (enqueue reconcile).
//
// A scan lists the bucket with ListObjectsV2, a page (up to 1,000 keys) at
// a time, the next page listed while this one is reconciled, so memory is
// bounded by three pages, a burst, and the directories the listing is
// inside (the ancestors of the current key, each with a SHA-256 state and
// at most MaxChangedKeys keys), whatever the bucket holds; a scan lasts
// about as long as its listing when the look-ups are quicker than S3's
// pages. A folder's keys are contiguous in S3's key order, so a folder is
// complete when the listing leaves it: its data objects (everything but
// folder.IsMarker's) are digested on the way as the worker digests its
// own listing (folder.Digest: keys and ETags), and counted, with the
// newest MaxChangedKeys of them kept. A folder holding its completion
// marker whose marker or any data object was last modified at or after
// Since (so a folder with an old marker and a new file is found) is
// mapped with s3events.PlanEvents and folder.Mapping, the rule of every
// other door. A burst of folders is looked up in the database:
//
//	a Running batch            → running (not enqueued)
//	newest: a failed publication that can still be resumed
//	                           → resumable, with its id (resume it; a
//	                             folder committed once is not loaded again)
//	newest: Succeeded, with the summary of the objects it loaded
//	(batch.ObjectsSummary), and the folder differs from it
//	                           → reimported: a new batch (past the
//	                             already_succeeded skip, for this folder
//	                             only), with Change: the reason (added,
//	                             removed, changed: an ETag, marker_rewritten)
//	                             and the keys modified after the load's
//	                             newest object; logged, counted in
//	                             ingest_reconcile_changed_total{reason};
//	                             superseded when the folder's newest
//	                             batch is no longer the one compared by
//	                             the time it is imported (a scan that
//	                             overlapped this one re-imported it)
//	a Succeeded batch          → already_succeeded (compared: unchanged;
//	                             no_summary: the batch is of an older build,
//	                             counted, not imported; partial: the scan
//	                             did not list the whole folder)
//	only Failed batches        → failed, reported with the newest one's id
//	                             and phase; enqueued only with
//	                             RetryFailedPreCommit and a pre-commit failure
//	newest Failed one failed for want of its marker (folder_incomplete)
//	                           → enqueued if this marker is not older than
//	                             that failure (the producer completed the
//	                             folder since), else failed
//	no batch                   → enqueued in one ImportMany burst
//	                             (ingest_reconcile_missed_total)
//
// A listing cannot name a removed object: removed says the folder holds
// fewer objects than the load read (Change counts both; the previous
// batch's ledger in the warehouse names them). A removal changes no
// last-modified time, so a scan with Since does not look a folder up for
// one: a scan without Since (a full pass) finds it. A folder the scan
// does not list whole is reconciled but not compared: one cut by Prefix,
// one the scan's start key is inside, one a failed listing or an ended
// context cuts. A period (MaxObjects) that ends inside a folder lists that
// folder to its end (its own prefix) and compares it; the next period
// starts inside it and meets no marker of it.
//
// The reservation makes a race with the notification paths harmless: a
// folder the SQS consumer reserves between the look-up and the burst
// answers conflict (or already_succeeded), never a second batch.
//
// S3 accepts any Unicode key, and a key holding a character XML 1.0 does
// not allow (U+0001) makes a listing page undecodable. So the listing asks
// for URL-encoded keys (EncodingType url) and decodes them; a key that
// does not decode, is not valid UTF-8 or holds a control character
// (folder.CheckKey) is skipped — counted in Summary.KeysSkipped and
// ingest_reconcile_keys_skipped_total, and logged escaped (the first
// MaxSkippedKeysLogged of a scan) — and the page goes on: every other
// folder on it and after it is reconciled. The worker refuses a folder
// holding such a key (folder.ErrUnreadableKey).
package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/s3events"
)

// Outcomes reported per folder (the outcome label of
// ingest_reconcile_folders_total).
const (
	OutcomeEnqueued         = "enqueued"
	OutcomeWouldEnqueue     = "would_enqueue"
	OutcomeRunning          = "running"
	OutcomeAlreadySucceeded = "already_succeeded"
	OutcomeFailed           = "failed"
	OutcomeResumable        = "resumable"
	OutcomeConflict         = "conflict"
	OutcomeUnmapped         = "unmapped"
	OutcomeInvalidInput     = "invalid_input"
	OutcomeEnqueueFailed    = "enqueue_failed"
	// OutcomeReimported: a published folder changed since its newest
	// batch's load (Folder.Change) and was imported again.
	OutcomeReimported = "reimported"
	// OutcomeWouldReimport: the same, in a dry run.
	OutcomeWouldReimport = "would_reimport"
	// OutcomeSuperseded: a published folder changed, but by the time it
	// was to be imported again its newest batch (BatchID) was no longer
	// the one compared: another scan's re-import of the change (a scan
	// that overlapped this one) came first. Not imported a second time.
	OutcomeSuperseded = "superseded"
)

// Defaults of Config.
const (
	BurstSizeDefault = 500
	MarkerDefault    = "_SUCCESS"
)

// MaxSkippedKeysLogged bounds the skipped keys a scan logs one by one; the
// rest are counted and logged as one number at the scan's end, so a bucket
// full of such keys cannot flood the log.
const MaxSkippedKeysLogged = 20

// Importer reserves and enqueues a burst of folders; *jobs.Enqueuer is one.
type Importer interface {
	ImportMany(ctx context.Context, reqs []jobs.ImportRequest) ([]jobs.Result, error)
}

// Config configures a scan.
type Config struct {
	// S3 lists the bucket; *s3.Client is one.
	S3     s3.ListObjectsV2APIClient
	Bucket string
	// Prefix bounds the listing (may be empty: the whole bucket).
	Prefix string
	// MaxBadRecords is the tolerance of bad records of the imports a
	// scan makes (jobs.ImportRequest.MaxBadRecords); 0: none.
	MaxBadRecords int
	// Marker is the object name whose existence completes a folder.
	// Defaults to MarkerDefault.
	Marker string
	// Mapping maps folders to tenants (its Buckets, if empty, is the
	// scanned bucket).
	Mapping  folder.Mapping
	Pool     *pgxpool.Pool
	Importer Importer
	// Since skips folders whose marker and data objects were all last
	// modified before it (zero: none skipped).
	Since time.Time
	// DryRun reports what would be enqueued and writes nothing.
	DryRun bool
	// RetryFailedPreCommit also enqueues folders whose batches all failed,
	// the newest before its warehouse commit (failed_pre_commit or
	// failed_enqueue). Never a failed publication (resume it) or a cancel.
	RetryFailedPreCommit bool
	// PublicationWindow is how long after its warehouse commit a failed
	// publication may still be resumed: a folder whose newest batch is
	// one is reported resumable. Defaults to batch.DefaultPublicationWindow.
	PublicationWindow time.Duration
	// BurstSize is how many folders are looked up and enqueued together
	// (at most jobs.MaxBurst). Defaults to BurstSizeDefault.
	BurstSize int
	// MaxObjects stops the scan after the page that reaches it (0: the
	// whole listing); Summary.Complete says whether the end was reached.
	MaxObjects int
	// Timeout bounds each database round of a scan (a burst's look-up,
	// its import) and each statement of a period's checkpoint
	// transaction: a connection that stopped answering (its database host
	// vanished in a failover) fails the round instead of holding the scan,
	// and the periodic loop, for as long as the kernel keeps the
	// connection. Defaults to TimeoutDefault (30 s).
	Timeout time.Duration
	// Report receives one report per completed folder, in listing order.
	Report  func(Folder)
	Metrics *metrics.Metrics
	Logger  *slog.Logger
}

// TimeoutDefault is Config.Timeout's default.
const TimeoutDefault = 30 * time.Second

func (c *Config) timeout() time.Duration { return cmp.Or(c.Timeout, TimeoutDefault) }

// Validate checks the settings without contacting anything. Errors are
// *ConfigError.
func (c *Config) Validate() error {
	switch {
	case c.Bucket == "":
		return &ConfigError{"Bucket", "is required"}
	case folder.ValidateBucketName(c.Bucket) != nil:
		return &ConfigError{"Bucket", folder.ValidateBucketName(c.Bucket).Error()}
	case c.BurstSize < 0 || c.BurstSize > jobs.MaxBurst:
		return &ConfigError{"BurstSize", fmt.Sprintf("must be 1 to %d", jobs.MaxBurst)}
	case c.MaxObjects < 0:
		return &ConfigError{"MaxObjects", "must not be negative"}
	case c.Timeout < 0:
		return &ConfigError{"Timeout", "must not be negative"}
	}
	m := c.mapping()
	if err := m.Validate(); err != nil {
		return &ConfigError{"Mapping", err.Error()}
	}
	if err := m.BucketAccepted(c.Bucket); err != nil {
		return &ConfigError{"Bucket", err.Error()}
	}
	return nil
}

func (c *Config) mapping() folder.Mapping {
	m := c.Mapping
	if len(m.Buckets) == 0 {
		m.Buckets = []string{c.Bucket}
	}
	return m
}

// ConfigError is a setting Validate refuses.
type ConfigError struct{ Setting, Reason string }

func (e *ConfigError) Error() string { return e.Setting + ": " + e.Reason }

// Folder is what a scan found for one completed folder: one JSON line of
// enqueue reconcile.
type Folder struct {
	Outcome        string `json:"outcome"`
	Folder         string `json:"folder"`
	TenantID       string `json:"tenant_id,omitempty"`
	BatchID        int64  `json:"batch_id,omitempty"`
	JobID          int64  `json:"job_id,omitempty"`
	RunningBatchID int64  `json:"running_batch_id,omitempty"`
	// Phase is the newest failed batch's phase (outcome failed).
	Phase    string    `json:"phase,omitempty"`
	MarkedAt time.Time `json:"marked_at"`
	Field    string    `json:"field,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	RetryOf  int64     `json:"retry_of,omitempty"`
	// Compared says, for a folder whose newest batch Succeeded, whether
	// the scan compared it with that batch's load (ComparedUnchanged,
	// ComparedChanged) or could not (ComparedNoSummary, ComparedPartial).
	Compared string `json:"compared,omitempty"`
	// Change is how the folder differs from that load (outcomes
	// reimported, would_reimport).
	Change *Change `json:"change,omitempty"`
}

// Summary counts what a scan did: the last JSON line of enqueue reconcile.
type Summary struct {
	Bucket        string `json:"bucket"`
	Prefix        string `json:"prefix"`
	ObjectsListed int    `json:"objects_listed"`
	// KeysSkipped counts the listed keys skipped because no door reads
	// them (folder.CheckKey, or an encoding that does not decode).
	KeysSkipped int            `json:"keys_skipped"`
	Pages       int            `json:"pages"`
	Folders     int            `json:"folders"`
	Outcomes    map[string]int `json:"outcomes"`
	// Complete: the listing reached its end. Otherwise LastKey is where
	// the next scan starts (StartAfter).
	Complete        bool    `json:"complete"`
	LastKey         string  `json:"last_key,omitempty"`
	DurationSeconds float64 `json:"duration_seconds"`
	DryRun          bool    `json:"dry_run,omitempty"`
	// Changed counts the published folders found changed since their
	// load, by reason (ChangeReasons).
	Changed map[string]int `json:"changed,omitempty"`
	// Unsummarized counts the published folders not compared because
	// their batch records no summary of what it loaded (an older build).
	Unsummarized int `json:"unsummarized,omitempty"`
}

// Scan lists the bucket from startAfter (empty: its beginning) and
// reconciles every completed folder. If ctx ends, the listing stops at the
// next page and what was listed is still reconciled (Complete false,
// LastKey the last key reconciled). An error is an infrastructure failure
// (S3 or the database); the folders reported before it stand.
func Scan(ctx context.Context, cfg Config, startAfter string) (Summary, error) {
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	cfg.Marker = cmp.Or(cfg.Marker, MarkerDefault)
	cfg.BurstSize = cmp.Or(cfg.BurstSize, BurstSizeDefault)
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Report == nil {
		cfg.Report = func(Folder) {}
	}
	start := time.Now()
	defer metrics.ObserveSince(cfg.Metrics.ReconcileScanDuration, start)
	s := &scan{cfg: cfg, sum: Summary{Bucket: cfg.Bucket, Prefix: cfg.Prefix, Outcomes: map[string]int{}, Changed: map[string]int{}, DryRun: cfg.DryRun}, startAfter: startAfter}
	work := context.WithoutCancel(ctx)
	// URL-encoded keys: a key with a character XML does not allow would
	// make its page undecodable (the AWS SDK does not decode them).
	in := &s3.ListObjectsV2Input{Bucket: aws.String(cfg.Bucket), EncodingType: types.EncodingTypeUrl}
	if cfg.Prefix != "" {
		in.Prefix = aws.String(cfg.Prefix)
	}
	if startAfter != "" {
		in.StartAfter = aws.String(startAfter)
	}
	// The next page is listed while this one is reconciled, so a scan
	// takes about as long as its listing (S3's page latency) when the
	// look-ups are quicker, and memory stays at a few pages.
	listCtx, stopListing := context.WithCancel(ctx)
	pages := prefetch(listCtx, s3.NewListObjectsV2Paginator(cfg.S3, in))
	defer func() {
		stopListing()
		for range pages { // the lister has stopped when the channel closes
		}
	}()
	err := func() error {
		for {
			if ctx.Err() != nil {
				return s.stop(work, false)
			}
			var (
				r  listed
				ok bool
			)
			select {
			case r, ok = <-pages:
			case <-ctx.Done():
				return s.stop(work, false)
			}
			if !ok {
				break
			}
			if r.err != nil {
				if ctx.Err() != nil {
					return s.stop(work, false)
				}
				// The folders whose markers were listed are reconciled
				// all the same (not compared: the listing is cut).
				return cmp.Or(s.stop(work, false), fmt.Errorf("listing s3://%s/%s: %w", cfg.Bucket, cfg.Prefix, r.err))
			}
			page := r.page
			s.sum.Pages++
			for _, obj := range page.Contents {
				s.sum.ObjectsListed++
				cfg.Metrics.ReconcileObjectsListed.Inc()
				key, err := folder.DecodeListedKey(aws.ToString(obj.Key))
				if err != nil {
					s.skip(aws.ToString(obj.Key), err)
					continue
				}
				if utf8.ValidString(key) && !strings.ContainsRune(key, 0) {
					// Where the next scan may start (a text column; S3's
					// StartAfter): skipped keys too, so that each is met
					// once per pass.
					s.lastListed = key
				}
				if err := folder.CheckKey(key); err != nil {
					s.skip(key, err)
					continue
				}
				if err := s.observe(work, key, etagOf(obj), aws.ToTime(obj.LastModified)); err != nil {
					return err
				}
			}
			if cfg.MaxObjects > 0 && s.sum.ObjectsListed >= cfg.MaxObjects {
				return s.stop(work, true)
			}
			// Everything up to here is listed; after the flush the folders
			// it completed are reconciled (a folder still open goes on on
			// the next page), and the next scan may start after it.
			if err := s.flush(work); err != nil {
				return err
			}
			s.sum.LastKey = s.lastListed
		}
		if err := s.closeAll(work); err != nil {
			return err
		}
		if err := s.flush(work); err != nil {
			return err
		}
		s.sum.Complete = true
		s.sum.LastKey = ""
		return nil
	}()
	if s.sum.Unsummarized > 0 {
		cfg.Logger.Info("reconcile: published folders whose batch records no summary of the objects it loaded (a build before the summary) were not compared",
			"folders", s.sum.Unsummarized, "first_folder", s.firstUnsummarized)
	}
	if n := s.sum.KeysSkipped - MaxSkippedKeysLogged; n > 0 {
		cfg.Logger.Warn("reconcile: more object keys skipped than logged one by one", "keys_skipped", s.sum.KeysSkipped, "not_logged", n)
	}
	s.sum.DurationSeconds = time.Since(start).Seconds()
	return s.sum, err
}

// listed is one page of the listing, or the error that ended it.
type listed struct {
	page *s3.ListObjectsV2Output
	err  error
}

// prefetch lists pages ahead of the scan, one page at most waiting to be
// reconciled; the channel closes after the last page, after an error, or
// when ctx ends.
func prefetch(ctx context.Context, pages *s3.ListObjectsV2Paginator) <-chan listed {
	out := make(chan listed, 1)
	go func() {
		defer close(out)
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			select {
			case out <- listed{page, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return out
}

type scan struct {
	cfg        Config
	sum        Summary
	startAfter string
	// dirs are the directories the listing is inside, outermost first:
	// the ancestors of the last key observed.
	dirs []*openDir
	// pending are the completed folders listed and not yet reconciled.
	pending           []*openDir
	lastListed        string
	firstUnsummarized string
}

// skip counts a listed key no door reads and logs it escaped, the first
// MaxSkippedKeysLogged of the scan.
func (s *scan) skip(key string, reason error) {
	s.sum.KeysSkipped++
	s.cfg.Metrics.ReconcileKeysSkipped.Inc()
	if s.sum.KeysSkipped <= MaxSkippedKeysLogged {
		s.cfg.Logger.Warn("reconcile: skipped an object key that no door reads", "key", strconv.Quote(key), "error", reason.Error())
	}
}

// observe accounts for one listed key: the directories the listing left
// are complete (a folder's keys are contiguous in key order), those it
// entered are opened, and the key is added to each directory it is in.
func (s *scan) observe(ctx context.Context, key, etag string, modified time.Time) error {
	for len(s.dirs) > 0 && !strings.HasPrefix(key, s.dirs[len(s.dirs)-1].dir+"/") {
		if err := s.closeDir(ctx); err != nil {
			return err
		}
	}
	from := 0
	if len(s.dirs) > 0 {
		from = len(s.dirs[len(s.dirs)-1].dir) + 1
	}
	for i := from; i < len(key); i++ {
		if key[i] == '/' {
			s.dirs = append(s.dirs, newOpenDir(key[:i], s.cfg.Prefix, s.startAfter))
		}
	}
	for _, d := range s.dirs {
		d.add(key, etag, modified, s.cfg.Marker)
	}
	return nil
}

// closeDir closes the innermost open directory: a completed folder (its
// marker listed) is reconciled with the next burst, when its marker or
// one of its objects was modified at or after Since.
func (s *scan) closeDir(ctx context.Context) error {
	d := s.dirs[len(s.dirs)-1]
	s.dirs = s.dirs[:len(s.dirs)-1]
	if d.marker == nil || !d.touchedSince(s.cfg.Since) {
		return nil
	}
	d.recent = slices.Clip(d.recent)
	s.pending = append(s.pending, d)
	if len(s.pending) >= s.cfg.BurstSize {
		return s.flush(ctx)
	}
	return nil
}

// closeAll closes every open directory (the listing's end).
func (s *scan) closeAll(ctx context.Context) error {
	for len(s.dirs) > 0 {
		if err := s.closeDir(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stop ends a scan that did not reach the listing's end, and reconciles
// every folder whose marker was listed. At the end of a period
// (MaxObjects), the folder of the last key listed is listed to its end
// (its own prefix, after that key), so that it is compared whole; the next
// scan, starting inside it, lists the rest again and does not compare it
// (ComparedPartial). Other open folders are cut: reconciled, not compared.
func (s *scan) stop(ctx context.Context, period bool) error {
	var completed *openDir
	if period && len(s.dirs) > 0 {
		d := s.dirs[len(s.dirs)-1]
		if d.whole && d.dir == path.Dir(s.lastListed) {
			if err := s.listRest(ctx, d); err != nil {
				s.cfg.Logger.Warn("reconcile: could not list the rest of the folder the period ended in; it is not compared", "folder", d.dir, "error", err.Error())
			} else {
				completed = d
			}
		}
	}
	for _, d := range s.dirs {
		if d != completed {
			d.whole = false
		}
	}
	if err := s.closeAll(ctx); err != nil {
		return err
	}
	if err := s.flush(ctx); err != nil {
		return err
	}
	if period {
		s.sum.LastKey = s.lastListed
	}
	return nil
}

// listRest lists d's objects after the last key listed into d.
func (s *scan) listRest(ctx context.Context, d *openDir) error {
	in := &s3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), EncodingType: types.EncodingTypeUrl,
		Prefix: aws.String(d.dir + "/"), StartAfter: aws.String(s.lastListed)}
	pages := s3.NewListObjectsV2Paginator(s.cfg.S3, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, obj := range page.Contents {
			key, err := folder.DecodeListedKey(aws.ToString(obj.Key))
			if err != nil || folder.CheckKey(key) != nil {
				continue // the next scan meets it, counts and logs it
			}
			d.add(key, etagOf(obj), aws.ToTime(obj.LastModified), s.cfg.Marker)
		}
	}
	return nil
}

// etagOf returns a listed object's ETag as the worker records it
// (folder.Object.ETag): S3's, without its quotes.
func etagOf(o types.Object) string {
	return strings.Trim(aws.ToString(o.ETag), `"`)
}

func (s *scan) report(f Folder) {
	s.sum.Folders++
	s.sum.Outcomes[f.Outcome]++
	s.cfg.Metrics.ReconcileFolders.WithLabelValues(f.Outcome).Inc()
	if f.Outcome == OutcomeEnqueued {
		s.cfg.Metrics.ReconcileMissed.Inc()
		s.cfg.Logger.Info("reconcile: a completed folder had no batch; enqueued", "folder", f.Folder, "tenant_id", f.TenantID, "batch_id", f.BatchID, "marked_at", f.MarkedAt)
	}
	if c := f.Change; c != nil {
		s.cfg.Logger.Info("reconcile: a published folder changed since its load; imported again",
			"outcome", f.Outcome, "folder", f.Folder, "tenant_id", f.TenantID, "batch_id", f.BatchID,
			"previous_batch_id", c.PreviousBatchID, "reason", c.Reason, "keys", c.Keys, "keys_truncated", c.KeysTruncated,
			"objects_before", c.ObjectsBefore, "objects_now", c.ObjectsNow)
	}
	s.cfg.Report(f)
}

// flush reconciles the pending folders: look-up, then one burst.
func (s *scan) flush(ctx context.Context) error {
	if len(s.pending) == 0 {
		return nil
	}
	dirs := s.pending
	s.pending = nil
	events := make([]s3events.ObjectEvent, len(dirs))
	for i, d := range dirs {
		events[i] = s3events.ObjectEvent{Bucket: s.cfg.Bucket, Key: d.marker.key, Created: true}
	}
	plans := s3events.PlanEvents(events, s.cfg.Marker, s.cfg.mapping())
	type candidate struct {
		i   int
		req jobs.ImportRequest
		key scopeKey
	}
	var cands []candidate
	var keys []scopeKey
	reports := make([]*Folder, len(plans))
	for i, p := range plans {
		f := &Folder{Folder: "s3://" + p.Bucket + "/" + path.Dir(p.Key), MarkedAt: dirs[i].marker.modified}
		reports[i] = f
		switch p.Outcome {
		case "":
			canon, err := folder.Canonicalize(p.Request.Folder)
			if err != nil {
				f.Outcome, f.Field, f.Reason = OutcomeInvalidInput, "folder", err.Error()
				continue
			}
			f.Folder, f.TenantID = p.Request.Folder, p.Request.TenantID
			p.Request.MaxBadRecords = s.cfg.MaxBadRecords
			k := scopeKey{tenant: p.Request.TenantID, scope: canon.Scope()}
			cands = append(cands, candidate{i: i, req: p.Request, key: k})
			keys = append(keys, k)
		case "unmapped":
			f.Outcome, f.Reason = OutcomeUnmapped, p.Reason
		default:
			f.Outcome, f.Field, f.Reason = OutcomeInvalidInput, p.Field, p.Reason
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout())
	defer cancel()
	states, err := lookup(ctx, s.cfg.Pool, keys, cmp.Or(s.cfg.PublicationWindow, batch.DefaultPublicationWindow))
	if err != nil {
		return fmt.Errorf("looking up %d folders' batches: %w", len(keys), err)
	}
	var burst []jobs.ImportRequest
	var burstAt []int
	for _, c := range cands {
		f := reports[c.i]
		st := states[c.key]
		switch {
		case st.running != 0:
			f.Outcome, f.RunningBatchID = OutcomeRunning, st.running
		case st.resumable:
			f.Outcome, f.BatchID, f.Phase = OutcomeResumable, st.failed, st.failedPhase
		case st.succeeded != 0:
			f.Outcome, f.BatchID = OutcomeAlreadySucceeded, st.succeeded
			if !st.newestSucceeded {
				continue // a newer batch failed: not compared
			}
			if f.Compared, f.Change = s.compare(dirs[c.i], st); f.Change == nil {
				continue
			}
			s.cfg.Metrics.ReconcileChanged.WithLabelValues(f.Change.Reason).Inc()
			s.sum.Changed[f.Change.Reason]++
			if s.cfg.DryRun {
				f.Outcome, f.BatchID = OutcomeWouldReimport, 0
				continue
			}
			// The newest batch Succeeded: a new batch of the folder,
			// past the already_succeeded skip (and only for this folder).
			req := c.req
			req.Reimport, req.ReimportOf = true, st.succeeded
			burst = append(burst, req)
			burstAt = append(burstAt, c.i)
		case st.failedIncompleteAt != nil && !markedSince(dirs[c.i].marker.modified, *st.failedIncompleteAt):
			// The worker found no marker, and this one is not newer than
			// that failure: reported, not enqueued again (a marker the
			// worker does not take for its own, --marker differing between
			// the two, would otherwise fail a batch every pass).
			f.Outcome, f.BatchID, f.Phase = OutcomeFailed, st.failed, st.failedPhase
		case st.failed != 0 && st.failedIncompleteAt == nil && !(s.cfg.RetryFailedPreCommit && preCommit(st.failedPhase)):
			f.Outcome, f.BatchID, f.Phase = OutcomeFailed, st.failed, st.failedPhase
		case s.cfg.DryRun:
			f.Outcome, f.RetryOf = OutcomeWouldEnqueue, st.failed
		default:
			f.RetryOf = st.failed
			burst = append(burst, c.req)
			burstAt = append(burstAt, c.i)
		}
	}
	if len(burst) > 0 {
		results, err := s.cfg.Importer.ImportMany(ctx, burst)
		if err != nil {
			return fmt.Errorf("enqueuing %d folders: %w", len(burst), err)
		}
		for k, r := range results {
			f := reports[burstAt[k]]
			f.BatchID, f.JobID, f.RunningBatchID = r.BatchID, r.JobID, r.RunningBatchID
			switch r.Outcome {
			case jobs.OutcomeEnqueued:
				f.Outcome = OutcomeEnqueued
				if f.Change != nil {
					f.Outcome = OutcomeReimported
				}
			case jobs.OutcomeConflict:
				f.Outcome = OutcomeConflict
			case jobs.OutcomeAlreadySucceeded:
				f.Outcome = OutcomeAlreadySucceeded
			case jobs.OutcomeResumable:
				f.Outcome, f.Phase = OutcomeResumable, r.Phase
			case jobs.OutcomeSuperseded:
				f.Outcome = OutcomeSuperseded
			case jobs.OutcomeInvalidInput:
				f.Outcome, f.Field, f.Reason = OutcomeInvalidInput, r.Field, r.Error
			default:
				f.Outcome, f.Reason = OutcomeEnqueueFailed, r.Error
			}
		}
	}
	for _, f := range reports {
		s.report(*f)
	}
	return nil
}

// markedSince reports whether a marker listed as modified at marked was
// (re)written after a batch failed at failedAt for want of it, at the
// second, the precision of S3's listings: a marker of the failure's own
// second counts as newer (at worst one more batch fails, once).
func markedSince(marked, failedAt time.Time) bool {
	return !marked.Truncate(time.Second).Before(failedAt.Truncate(time.Second))
}

// compare compares a folder whose newest batch Succeeded with the summary
// of the objects that batch loaded: what Folder.Compared says, and the
// change, nil when there is none or the folder cannot be compared.
func (s *scan) compare(d *openDir, st scopeState) (string, *Change) {
	if !d.whole {
		return ComparedPartial, nil
	}
	sum, ok := parseSummary(st.objects)
	if !ok {
		s.sum.Unsummarized++
		s.cfg.Metrics.ReconcileUnsummarized.Inc()
		if s.firstUnsummarized == "" {
			s.firstUnsummarized = "s3://" + s.cfg.Bucket + "/" + d.dir
		}
		return ComparedNoSummary, nil
	}
	c := d.compare(sum, s.cfg.Marker)
	if c == nil {
		return ComparedUnchanged, nil
	}
	c.PreviousBatchID = st.succeeded
	return ComparedChanged, c
}

// preCommit reports whether a failed batch's phase is a failure before
// the warehouse commit, which a new batch may retry.
func preCommit(phase string) bool {
	return phase == string(batch.PhaseFailedPreCommit) || phase == string(batch.PhaseFailedEnqueue)
}
