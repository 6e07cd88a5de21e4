package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/audit"
	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/folder"
	"github.com/fleet/ingest/internal/grants"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/metrics"
	"github.com/fleet/ingest/internal/uploads"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/warehousecli"
)

type enqueueCLI struct {
	cli.Globals
	Timeout time.Duration `name:"timeout" env:"ENQUEUE_TIMEOUT" default:"30s" help:"Give up on the database after this long (serve: when connecting at start, and for the database work of each request; sqs: each round's import; reconcile: each look-up and import of a burst, and each statement of a period's checkpoint)."`

	Import importCmd `cmd:"" help:"Reserve a batch for a tenant's folder and enqueue its job (one transaction)."`
	Resume resumeCmd `cmd:"" help:"Resume a batch whose warehouse commit succeeded but whose publication failed."`
	Retry  retryCmd  `cmd:"" help:"Start a new batch for the folder of a batch that failed before its warehouse commit, or was cancelled. Refused while a newer batch of the folder is Running (conflict), succeeded (already_succeeded) or is a failed publication that can still be resumed (not_retryable, newer_batch_resumable, newer_batch_id: resume that batch instead)."`
	Cancel cancelCmd `cmd:"" help:"Cancel a Running batch (also a parked one): its worker stops, its load aborts before commit, its scope is free at once."`
	Status statusCmd `cmd:"" help:"Show one batch: status, phase, lease holder, expiry, generation, age."`
	List   listCmd   `cmd:"" help:"List batches, newest first."`
	Serve  serveCmd  `cmd:"" help:"Serve the HTTP listener for upload notifications (POST /v1/imports, POST /v1/events/s3)."`
	SQS    sqsCmd    `cmd:"" name:"sqs" help:"Consume S3 upload notifications from an SQS queue: the folders of each receive are imported in one transaction, then their messages deleted."`

	Token tokenCmd `cmd:"" help:"Tokens of enqueue serve: tenant tokens (--tenant-tokens-file) and operator tokens (--operator-token-file)."`

	// Finding what notifications lost.
	Reconcile reconcileCmd `cmd:"" help:"List a bucket for completed folders without a batch (their notification was lost) and enqueue them. One JSON line per folder and a summary; --every runs periodically."`

	// The operators' audit.
	Audit auditCmd `cmd:"" help:"List the operator actions recorded (cancel, retry, resume, prune, River UI job actions, queue pause and resume), newest first: who (from the credential), when, what, why. Needs the operators' login (fleet_operator)."`

	// Retention.
	Prune pruneCmd `cmd:"" help:"Delete batch history older than --older-than (dry run unless --apply), never a Running batch, a folder's newest or newest Succeeded batch, a resumable failed publication or a batch a kept retry names. Needs the operators' login (fleet_operator)."`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c enqueueCLI
	kctx, code, ok := cli.Parse(&c, args, stdout, stderr, "enqueue",
		"Reserve Fleet ingestion batches and enqueue their jobs. Prints one JSON line per outcome on stdout.", kong.Vars{},
		func(field, reason string) {
			fmt.Fprintf(stderr, "enqueue: %s\n", reason)
			cli.JSONOutcome(stdout)(field, reason)
		})
	if !ok {
		return code
	}
	e := &cli.Env{Ctx: ctx, Stdout: stdout, Stderr: stderr, Logger: c.Logger(stderr)}
	err := kctx.Run(&c.Globals, &c, e)
	if err == nil {
		return cli.ExitOK
	}
	var coded cli.ExitError
	if errors.As(err, &coded) {
		if coded.Err != nil {
			e.Logger.Debug("exit", "code", coded.Code, "error", coded.Err.Error())
		}
		return coded.Code
	}
	err = privilegeHint(cli.MigrateHint(err))
	e.Logger.Error(err.Error())
	printJSON(stdout, map[string]string{"outcome": "error", "error": err.Error()})
	return cli.ExitInfra
}

// privilegeHint names the login an error of insufficient privilege (SQLSTATE
// 42501) calls for: each kind of caller has its own (deploy/postgres/roles.sql).
// Other errors are returned as they are.
func privilegeHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("the database login of DATABASE_URL may not do this (%s): imports need the doors' login (fleet_enqueue); cancel, retry, resume and prune the operators' (fleet_operator): %w", pgErr.Message, err)
	}
	return err
}

// printJSON prints v as one line of JSON, inert on a terminal (inertJSON).
func printJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "%s\n", inertJSON(b))
}

// connect opens the operational pool, mapping a missing URL to invalid input.
func connect(c *enqueueCLI, e *cli.Env) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	pool, err := c.Globals.Connect(ctx, c.Timeout, nil)
	if errors.Is(err, cli.ErrNoDatabaseURL) {
		printJSON(e.Stdout, map[string]string{"outcome": "invalid_input", "field": "database_url", "error": err.Error()})
		return nil, cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	return pool, err
}

// invalid reports an *jobs.InputError as the invalid_input outcome.
func invalid(e *cli.Env, err error) error {
	var in *jobs.InputError
	if errors.As(err, &in) {
		printJSON(e.Stdout, map[string]string{"outcome": "invalid_input", "field": in.Field, "error": in.Reason})
		e.Logger.Error("invalid input", "field", in.Field, "error", in.Reason)
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	return err
}

// exitCode maps an outcome to the command's exit code.
func exitCode(outcome string) int {
	switch outcome {
	case jobs.OutcomeEnqueued, jobs.OutcomeResumed, jobs.OutcomeAlreadySucceeded, jobs.OutcomeCancelled:
		return cli.ExitOK
	case jobs.OutcomeConflict:
		return cli.ExitConflict
	case jobs.OutcomeEnqueueFailed:
		return cli.ExitEnqueueFail
	case jobs.OutcomeResumable:
		return cli.ExitResumable
	default:
		return cli.ExitNotResumable
	}
}

// act connects, builds the enqueuer and runs one operation under
// --timeout, reporting its outcome.
func act(c *enqueueCLI, e *cli.Env, op func(context.Context, *jobs.Enqueuer) (jobs.Result, error)) error {
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	enq, err := newEnqueuer(c, e, pool, nil, 0)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	return report(e)(op(ctx, enq))
}

func newEnqueuer(c *enqueueCLI, e *cli.Env, pool *pgxpool.Pool, stamps warehouse.StampReader, window time.Duration) (*jobs.Enqueuer, error) {
	client, err := jobs.NewInsertClient(pool, e.Logger)
	if err != nil {
		return nil, err
	}
	enq := &jobs.Enqueuer{Pool: pool, River: client, PublicationWindow: window, Metrics: metrics.New(), Logger: e.Logger}
	if stamps != nil {
		enq.Verifier = warehouse.Verifier(stamps)
	}
	return enq, nil
}

// invalidFlag reports an invalid warehouse setting as invalid input (the
// JSON contract, exit 2); other errors pass.
func invalidFlag(e *cli.Env, err error) error {
	var fe *warehousecli.FlagError
	if errors.As(err, &fe) {
		return invalid(e, &jobs.InputError{Field: fe.Field(), Reason: fe.Error()})
	}
	return err
}

// mappingFlags are the rule that ties a folder to its tenant: an s3://
// folder's path names the tenant, database and company it is imported as
// (folder.Mapping), and only accepted buckets are imported. enqueue serve,
// import and retry take the same flags, variables and defaults, and check
// them the same way (uploads.ResolveImportWith), so the command line refuses
// what the door refuses — the worker parks the rest.
type mappingFlags struct {
	PathPattern string   `name:"path-pattern" env:"PATH_PATTERN" default:"tenants/{tenant_id}/{tenant_database}/{company_id}/" help:"How an S3 folder maps to tenant, database and company: an s3:// folder is imported only as the tenant, database and company its path names (serve, import and retry alike). Use the same pattern as the worker."`
	Buckets     []string `name:"bucket" env:"ACCEPTED_BUCKETS" help:"Accept s3:// folders only of these buckets (repeatable; default: any bucket whose name is a valid S3 bucket name). serve, import and retry alike; give the worker the same list."`
}

func (m mappingFlags) mapping() folder.Mapping {
	return folder.Mapping{Pattern: m.PathPattern, Buckets: m.Buckets}
}

// validate reports an invalid --path-pattern or --bucket as invalid input.
func (m mappingFlags) validate(e *cli.Env) error {
	if err := m.mapping().Validate(); err != nil {
		field := "path_pattern"
		if strings.HasPrefix(err.Error(), "bucket allow-list") {
			field = "bucket"
		}
		return refuseSetting(e, field, fmt.Errorf("--%s: %w", strings.ReplaceAll(field, "_", "-"), err))
	}
	return nil
}

// resolve applies the door's rule (uploads.ResolveImportWith) to an import
// of the command line: an s3:// folder must be of an accepted bucket and
// its path must name req's tenant, database and company; file:// and mem://
// folders are the command line's own (development) and keep req's. The
// import it may run is returned with its folder canonical, or the refusal.
func (m mappingFlags) resolve(req jobs.ImportRequest) (jobs.ImportRequest, error) {
	body := uploads.ImportBody{TenantID: req.TenantID, TenantDatabase: req.TenantDatabase, CompanyID: req.CompanyID, Folder: req.Folder, Reimport: req.Reimport}
	// The command line names all three (an empty one is refused here, not
	// filled in from the path), checked as before.
	if err := jobs.ValidateImport(req); err != nil {
		return jobs.ImportRequest{}, err
	}
	out, refusal := uploads.ResolveImportWith(m.mapping(), body, uploads.ImportRules{AllowLocal: true, WithoutMarker: req.NoMarker, MaxBadRecords: req.MaxBadRecords})
	if refusal != nil {
		return jobs.ImportRequest{}, refusal
	}
	return out, nil
}

type importCmd struct {
	TenantID       string `name:"tenant-id" required:"" help:"Canonical tenant id."`
	TenantDatabase string `name:"tenant-database" required:"" help:"Tenant database name."`
	CompanyID      string `name:"company-id" required:"" help:"Company (customer) id."`
	Folder         string `name:"folder" required:"" xor:"source" help:"Source folder URL: s3://bucket/prefix, file:///dir or mem://bucket/prefix."`
	FromFile       string `name:"from-file" required:"" xor:"source" type:"existingfile" help:"Import every folder listed in this file (one URL per line; blank lines and lines starting with # are skipped) as bursts of up to 1000 in one transaction each. Prints one JSON line per folder, in order; exits with the code of the worst outcome."`
	Reimport       bool   `name:"reimport" help:"Start a new batch even if the folder's latest batch succeeded (otherwise: already_succeeded)."`
	MaxBadRecords  int    `name:"max-bad-records" default:"0" help:"Skip up to this many bad records (a CSV row or NDJSON line that cannot be stored), each recorded with the slice in the warehouse's errors table (curated.fleet_load_errors); one more fails the batch. 0 to 10000; 0: the first bad record fails the batch."`
	NoMarker       bool   `name:"no-marker" help:"Load the folder without its completion marker (for a producer that writes none). Without it, a folder that holds no marker (worker --marker, _SUCCESS) fails before any warehouse write: failed_pre_commit, reason folder_incomplete."`
	mappingFlags
}

func (i *importCmd) Run(c *enqueueCLI, e *cli.Env) error {
	if i.FromFile != "" {
		return i.runFromFile(c, e)
	}
	if err := i.mappingFlags.validate(e); err != nil {
		return err
	}
	req, err := i.resolve(jobs.ImportRequest{TenantID: i.TenantID, TenantDatabase: i.TenantDatabase, CompanyID: i.CompanyID, Folder: i.Folder, Reimport: i.Reimport, NoMarker: i.NoMarker, MaxBadRecords: i.MaxBadRecords})
	if err != nil {
		return invalid(e, err)
	}
	return act(c, e, func(ctx context.Context, enq *jobs.Enqueuer) (jobs.Result, error) { return enq.Import(ctx, req) })
}

// runFromFile imports every folder listed in --from-file with
// Enqueuer.ImportMany, printing one JSON line per folder. A line that is
// not a valid folder (or flags that are invalid for every line) answer
// invalid_input for that line; nothing is written for it.
func (i *importCmd) runFromFile(c *enqueueCLI, e *cli.Env) error {
	raw, err := os.ReadFile(i.FromFile)
	if err != nil {
		return invalid(e, &jobs.InputError{Field: "from_file", Reason: err.Error()})
	}
	if err := i.mappingFlags.validate(e); err != nil {
		return err
	}
	// Each line meets the door's rule (resolve); a line it refuses answers
	// invalid_input in its place and is not imported.
	var (
		reqs    []jobs.ImportRequest
		refused = map[int]jobs.Result{} // by line, among the folders listed
		listed  int
	)
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		listed++
		req, err := i.resolve(jobs.ImportRequest{TenantID: i.TenantID, TenantDatabase: i.TenantDatabase, CompanyID: i.CompanyID, Folder: line, Reimport: i.Reimport, NoMarker: i.NoMarker, MaxBadRecords: i.MaxBadRecords})
		if err != nil {
			in := &jobs.InputError{Field: "folder", Reason: err.Error()}
			errors.As(err, &in)
			refused[listed-1] = jobs.Result{Outcome: jobs.OutcomeInvalidInput, Field: in.Field, Error: in.Reason}
			continue
		}
		reqs = append(reqs, req)
	}
	if listed == 0 {
		return invalid(e, &jobs.InputError{Field: "from_file", Reason: "lists no folder"})
	}
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	enq, err := newEnqueuer(c, e, pool, nil, 0)
	if err != nil {
		return err
	}
	// --timeout bounds each burst.
	ctx, cancel := context.WithTimeout(e.Ctx, time.Duration(1+len(reqs)/jobs.MaxBurst)*c.Timeout)
	defer cancel()
	imported, err := enq.ImportMany(ctx, reqs)
	// The answers in the file's order: each refused line in its place, then
	// the imports' answers (all of them, or those committed before an
	// error).
	var results []jobs.Result
	for n := 0; n < listed; n++ {
		if res, ok := refused[n]; ok {
			results = append(results, res)
			continue
		}
		if len(imported) == 0 {
			break
		}
		results = append(results, imported[0])
		imported = imported[1:]
	}
	worst := cli.ExitOK
	// On an error the bursts committed before it still have their answers.
	for _, res := range results {
		printJSON(e.Stdout, res)
		code := exitCode(res.Outcome)
		if res.Outcome == jobs.OutcomeInvalidInput {
			code = cli.ExitInvalidInput
		}
		if exitSeverity(code) > exitSeverity(worst) {
			worst = code
		}
	}
	if err != nil {
		return err
	}
	if worst != cli.ExitOK {
		return cli.ExitError{Code: worst}
	}
	return nil
}

// exitSeverity orders the exit codes of import outcomes, so a file of
// imports exits with its worst: enqueue failed, invalid input, resumable,
// conflict.
func exitSeverity(code int) int {
	switch code {
	case cli.ExitOK:
		return 0
	case cli.ExitConflict:
		return 1
	case cli.ExitResumable:
		return 2
	case cli.ExitInvalidInput:
		return 3
	case cli.ExitEnqueueFail:
		return 4
	}
	return 5
}

// report returns a function that prints an outcome as the command's one
// JSON line and turns it into the command's exit code.
func report(e *cli.Env) func(jobs.Result, error) error {
	return func(res jobs.Result, err error) error {
		if err != nil {
			return invalid(e, err)
		}
		printJSON(e.Stdout, res)
		if code := exitCode(res.Outcome); code != cli.ExitOK {
			return cli.ExitError{Code: code, Err: nil}
		}
		return nil
	}
}

type resumeCmd struct {
	BatchID           int64         `name:"batch-id" required:"" help:"The failed batch."`
	TenantID          string        `name:"tenant-id" required:"" help:"The batch's tenant."`
	Folder            string        `name:"folder" help:"The batch's source folder URL (optional: the batch knows it; if given it must match)."`
	PublicationWindow time.Duration `name:"publication-window" env:"PUBLICATION_WINDOW" default:"24h" help:"A batch committed longer ago than this is publication_expired."`
	operator

	// The warehouse whose stamp proves the slice is still the batch's: the
	// same settings as the workers' (--redshift-iam-role and
	// --redshift-staging are not needed to read a stamp).
	warehousecli.Flags
}

func (r *resumeCmd) Run(c *enqueueCLI, e *cli.Env) error {
	req := jobs.ResumeRequest{BatchID: r.BatchID, TenantID: r.TenantID, Folder: r.Folder, Reason: r.Reason}
	if err := r.checkOperator(); err != nil {
		return invalid(e, err)
	}
	if err := jobs.ValidateResume(req); err != nil {
		return invalid(e, err)
	}
	if r.PublicationWindow <= 0 {
		return invalid(e, &jobs.InputError{Field: "publication_window", Reason: "must be positive"})
	}
	if err := r.Flags.Validate(false); err != nil {
		return invalidFlag(e, err)
	}
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	stamps, _, closeStamps, err := r.Flags.OpenStamps(e.Ctx, c.DatabasePooler, e.Logger)
	if err != nil {
		return invalidFlag(e, err)
	}
	defer closeStamps()
	if stamps == nil {
		stamps = warehouse.NewPostgres(pool) // the local warehouse shares the operational database
	}
	enq, err := newEnqueuer(c, e, pool, stamps, r.PublicationWindow)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	defer cancel()
	if req.Actor, err = r.actor(ctx, pool); err != nil {
		return err
	}
	return report(e)(enq.Resume(ctx, req))
}

type retryCmd struct {
	BatchID  int64  `name:"batch-id" required:"" help:"The failed (failed_pre_commit, failed_enqueue) or cancelled batch."`
	TenantID string `name:"tenant-id" required:"" help:"The batch's tenant."`
	operator
	// The batch's s3:// folder must still name its tenant, database and
	// company, in an accepted bucket, as an import of it would.
	mappingFlags
}

func (r *retryCmd) Run(c *enqueueCLI, e *cli.Env) error {
	req := jobs.RetryRequest{BatchID: r.BatchID, TenantID: r.TenantID, Reason: r.Reason}
	if err := r.checkOperator(); err != nil {
		return invalid(e, err)
	}
	if err := jobs.ValidateRetry(req); err != nil {
		return invalid(e, err)
	}
	if err := r.mappingFlags.validate(e); err != nil {
		return err
	}
	// The batch's folder meets today's rule, as a new import of it would.
	req.Admit = func(imp jobs.ImportRequest) error {
		if _, err := r.resolve(imp); err != nil {
			var in *jobs.InputError
			if errors.As(err, &in) {
				return &jobs.InputError{Field: in.Field, Reason: fmt.Sprintf("batch %d cannot be retried: %s", r.BatchID, in.Reason)}
			}
			return err
		}
		return nil
	}
	return act(c, e, func(ctx context.Context, enq *jobs.Enqueuer) (jobs.Result, error) {
		var err error
		if req.Actor, err = r.actor(ctx, enq.Pool); err != nil {
			return jobs.Result{}, err
		}
		return enq.Retry(ctx, req)
	})
}

type cancelCmd struct {
	BatchID  int64  `name:"batch-id" required:"" help:"The Running batch."`
	TenantID string `name:"tenant-id" required:"" help:"The batch's tenant."`
	operator
}

// operator is who runs an operator action (cancel, retry, resume, prune)
// and why. Who is the command's credential, its database login
// (current_user): recorded in the operators' audit (enqueue audit) and
// logged with the action (jobs.OperatorLog), and a cancel records it
// (cancelled_by, "cli:<login>"). What the caller says of itself (--by) and
// the OS user are only a note beside it.
type operator struct {
	Reason string `name:"reason" help:"Why: recorded in the operators' audit (enqueue audit) and logged with the action (and recorded with a cancel)."`
	By     string `name:"by" env:"ENQUEUE_OPERATOR" help:"A name to note beside the action (free text, in the audit's note with the OS user). Who acts is the database login, not this."`
}

// checkOperator checks --by and --reason as a cancel records them.
func (o operator) checkOperator() error {
	if err := batch.ValidateOperator(cmp.Or(o.By, "unnamed"), o.Reason); err != nil {
		var v *batch.ValidationError
		if errors.As(err, &v) {
			return &jobs.InputError{Field: v.Field, Reason: v.Reason}
		}
		return err
	}
	return nil
}

// actor is who runs the command: its database login on pool, through the
// CLI, with --by and the OS user as the note.
func (o operator) actor(ctx context.Context, pool *pgxpool.Pool) (audit.Actor, error) {
	login, err := audit.CurrentLogin(ctx, pool)
	if err != nil {
		return audit.Actor{}, err
	}
	says := ""
	if o.By != "" {
		says = "says " + o.By
	}
	osUser := cmp.Or(os.Getenv("USER"), "unknown")
	if host, err := os.Hostname(); err == nil {
		osUser += "@" + host
	}
	return audit.Actor{Name: login, Door: audit.DoorCLI, Note: audit.Notes(says, "os user "+osUser)}, nil
}

func (k *cancelCmd) Run(c *enqueueCLI, e *cli.Env) error {
	req := jobs.CancelRequest{BatchID: k.BatchID, TenantID: k.TenantID, Reason: k.Reason, Actor: audit.Actor{Door: audit.DoorCLI}}
	if err := k.checkOperator(); err != nil {
		return invalid(e, err)
	}
	if err := jobs.ValidateCancel(req); err != nil {
		return invalid(e, err)
	}
	return act(c, e, func(ctx context.Context, enq *jobs.Enqueuer) (jobs.Result, error) {
		var err error
		if req.Actor, err = k.actor(ctx, enq.Pool); err != nil {
			return jobs.Result{}, err
		}
		return enq.Cancel(ctx, req)
	})
}

// requireGrants is cli.RequireGrants with enqueue's output contract: a
// login that lacks grants of deploy/postgres/roles.sql is also answered on
// stdout, {"outcome":"missing_grants","role":…,"login":…,"missing":[…],
// "error":…}, before the command exits cli.ExitMissingGrants.
func requireGrants(e *cli.Env, q grants.Querier, role grants.Role) error {
	err := cli.RequireGrants(e.Ctx, e, q, role)
	var missing *grants.MissingError
	if errors.As(err, &missing) {
		printJSON(e.Stdout, map[string]any{"outcome": "missing_grants", "role": missing.Role, "login": missing.Login,
			"missing": missing.Names(), "error": missing.Error()})
	}
	return err
}
