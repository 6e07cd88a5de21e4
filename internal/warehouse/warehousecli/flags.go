// Package warehousecli holds the command-line settings that choose and
// reach the warehouse, shared by both binaries: worker run and migrate load
// and migrate it; enqueue resume reads its stamps to prove a slice is still
// a failed publication's own, and enqueue status --objects its load ledger.
package warehousecli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
)

// Warehouse kinds.
const (
	KindPostgres = "postgres"
	KindRedshift = "redshift"
)

// Flags choose and configure the warehouse. Embed them in a kong command.
type Flags struct {
	Warehouse    string        `name:"warehouse" env:"WAREHOUSE" enum:"postgres,redshift" default:"postgres" help:"Where Fleet folders are loaded: postgres (schema curated in a PostgreSQL database: local and development) or redshift (Amazon Redshift through the Data API: production)."`
	WarehouseURL string        `name:"warehouse-url" env:"WAREHOUSE_URL" help:"With --warehouse postgres: connection string of the warehouse database (schema curated). Defaults to the operational database."`
	Redshift     RedshiftFlags `embed:"" prefix:"redshift-" envprefix:"REDSHIFT_" group:"Redshift (--warehouse redshift; AWS credentials and AWS_REGION from the standard AWS configuration chain)"`
}

// RedshiftFlags are the settings of redshift.Config.
type RedshiftFlags struct {
	Workgroup    string        `name:"workgroup" env:"WORKGROUP" help:"Redshift Serverless workgroup holding the warehouse (or --redshift-cluster-id)."`
	ClusterID    string        `name:"cluster-id" env:"CLUSTER_ID" help:"Provisioned Redshift cluster identifier (or --redshift-workgroup)."`
	Database     string        `name:"database" env:"DATABASE" help:"Database holding schema curated."`
	SecretARN    string        `name:"secret-arn" env:"SECRET_ARN" help:"Secrets Manager secret (ARN or name) with the database user's credentials. Without it or --redshift-db-user, the database user is derived from the caller's IAM identity."`
	DBUser       string        `name:"db-user" env:"DB_USER" help:"Database user for temporary credentials (redshift:GetClusterCredentials); provisioned clusters only."`
	IAMRole      string        `name:"iam-role" env:"IAM_ROLE" help:"IAM role Redshift assumes to read the staging objects during COPY: a role ARN associated with the workgroup or cluster, or \"default\" for its default role. Needed by worker run only."`
	Staging      string        `name:"staging" env:"STAGING" help:"Where loads are staged: s3://bucket/prefix/ (letters, digits, _ . / = - only), in the warehouse's region; objects are deleted once their batch's commit is confirmed, and a lifecycle rule on the prefix is the backstop. Needed by worker run only."`
	LoadTimeout  time.Duration `name:"load-timeout" env:"LOAD_TIMEOUT" default:"1h" help:"How long a load's transaction is awaited; after it the stamp is read back and the batch retried if it did not commit (the statement is not cancelled)."`
	QueryTimeout time.Duration `name:"query-timeout" env:"QUERY_TIMEOUT" default:"2m" help:"How long a stamp read, a publication or a migration is awaited."`
}

// set reports whether any Redshift setting was given.
func (r RedshiftFlags) set() bool {
	return r.Workgroup != "" || r.ClusterID != "" || r.Database != "" || r.SecretARN != "" || r.DBUser != "" || r.IAMRole != "" || r.Staging != ""
}

// Config returns the Redshift settings as a redshift.Config logging to log.
func (r RedshiftFlags) Config(log *slog.Logger) redshift.Config {
	return redshift.Config{
		WorkgroupName: r.Workgroup, ClusterID: r.ClusterID, Database: r.Database, SecretARN: r.SecretARN, DBUser: r.DBUser,
		IAMRole: r.IAMRole, Staging: r.Staging, LoadTimeout: r.LoadTimeout, QueryTimeout: r.QueryTimeout, Logger: log,
	}
}

// FlagError is an invalid setting: Flag names it (--redshift-staging,
// AWS_REGION, …). Callers report it as invalid input.
type FlagError struct {
	Flag   string
	Reason string
}

func (e *FlagError) Error() string { return e.Flag + ": " + e.Reason }

// Field is the flag's name as a JSON field: redshift_staging, aws_region.
func (e *FlagError) Field() string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimLeft(e.Flag, "-")), "-", "_")
}

// flagError names the flag of a redshift.ConfigError; other errors pass.
func flagError(err error) error {
	var ce *redshift.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	if ce.Field == "region" {
		return &FlagError{Flag: "AWS_REGION", Reason: ce.Reason}
	}
	return &FlagError{Flag: "--redshift-" + ce.Field, Reason: ce.Reason}
}

// ExitError wraps a *FlagError in the invalid-input exit code; other errors
// pass unchanged.
func ExitError(err error) error {
	var fe *FlagError
	if errors.As(err, &fe) {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	return err
}

// IsRedshift reports whether the warehouse is Redshift.
func (f *Flags) IsRedshift() bool { return f.Warehouse == KindRedshift }

// Validate checks the settings before anything connects: the Redshift ones
// need --warehouse redshift, and the other way round. Loading needs every
// Redshift setting; migrating and reading stamps only those naming the
// warehouse. It returns a *FlagError.
func (f *Flags) Validate(loading bool) error {
	switch f.Warehouse {
	case KindRedshift:
		if f.WarehouseURL != "" {
			return &FlagError{Flag: "--warehouse-url", Reason: "is for --warehouse postgres; Redshift is reached through the Data API (--redshift-*)"}
		}
		if f.Redshift.LoadTimeout <= 0 {
			return &FlagError{Flag: "--redshift-load-timeout", Reason: "must be positive"}
		}
		if f.Redshift.QueryTimeout <= 0 {
			return &FlagError{Flag: "--redshift-query-timeout", Reason: "must be positive"}
		}
		cfg := f.Redshift.Config(nil)
		validate := cfg.ValidateTarget
		if loading {
			validate = cfg.Validate
		}
		return flagError(validate())
	default:
		if f.Redshift.set() {
			return &FlagError{Flag: "--warehouse", Reason: "the --redshift-* settings need --warehouse redshift"}
		}
	}
	return nil
}

// Open returns the warehouse to load into, a description of it for logs
// (no secrets) and a function releasing it. The PostgreSQL warehouse gets a
// pool of poolSize connections on --warehouse-url, or on databaseURL.
func (f *Flags) Open(ctx context.Context, databaseURL string, pooler cli.Pooler, poolSize int32, log *slog.Logger) (warehouse.Warehouse, string, func(), error) {
	if err := f.Validate(true); err != nil {
		return nil, "", nil, err
	}
	if f.IsRedshift() {
		cfg := f.Redshift.Config(log)
		wh, err := redshift.Open(ctx, cfg)
		if err != nil {
			return nil, "", nil, flagError(err)
		}
		return wh, describe(cfg) + " staging " + cfg.Staging, func() {}, nil
	}
	pool, url, err := f.connect(ctx, databaseURL, pooler, poolSize)
	if err != nil {
		return nil, "", nil, err
	}
	wh := warehouse.NewPostgres(pool)
	if url == databaseURL {
		// The warehouse shares the operational database: its loads and
		// publications are fenced on the batch row (see WithBatchFence).
		wh = wh.WithBatchFence()
	}
	return wh, "postgres " + cli.Redact(url), pool.Close, nil
}

// OpenStamps returns a reader of the warehouse's slice stamps (what resume
// needs), a description of it for logs and a function releasing it. For
// PostgreSQL it connects to --warehouse-url; with none it returns nil: the
// caller reads the stamps on the operational database it already holds.
func (f *Flags) OpenStamps(ctx context.Context, pooler cli.Pooler, log *slog.Logger) (warehouse.StampReader, string, func(), error) {
	if err := f.Validate(false); err != nil {
		return nil, "", nil, err
	}
	if f.IsRedshift() {
		cfg := f.Redshift.Config(log)
		st, err := redshift.OpenStamps(ctx, cfg)
		if err != nil {
			return nil, "", nil, flagError(err)
		}
		return st, describe(cfg), func() {}, nil
	}
	if f.WarehouseURL == "" {
		return nil, "", func() {}, nil
	}
	pool, url, err := f.connect(ctx, "", pooler, 2)
	if err != nil {
		return nil, "", nil, err
	}
	return warehouse.NewPostgres(pool), "postgres " + cli.Redact(url), pool.Close, nil
}

// OpenLedger returns a reader of the warehouse's load ledger (what status
// --objects needs), a description of it for logs and a function releasing
// it. It needs what OpenStamps needs; for PostgreSQL without
// --warehouse-url it returns nil: the caller reads the ledger on the
// operational database it already holds.
func (f *Flags) OpenLedger(ctx context.Context, pooler cli.Pooler, log *slog.Logger) (warehouse.LedgerReader, string, func(), error) {
	if err := f.Validate(false); err != nil {
		return nil, "", nil, err
	}
	if f.IsRedshift() {
		cfg := f.Redshift.Config(log)
		st, err := redshift.OpenStamps(ctx, cfg)
		if err != nil {
			return nil, "", nil, flagError(err)
		}
		return st, describe(cfg), func() {}, nil
	}
	if f.WarehouseURL == "" {
		return nil, "", func() {}, nil
	}
	pool, url, err := f.connect(ctx, "", pooler, 2)
	if err != nil {
		return nil, "", nil, err
	}
	return warehouse.NewPostgres(pool), "postgres " + cli.Redact(url), pool.Close, nil
}

// OpenMigrator returns the migrator of the Redshift warehouse's schema.
func (f *Flags) OpenMigrator(ctx context.Context, log *slog.Logger) (*redshift.Migrator, error) {
	if err := f.Validate(false); err != nil {
		return nil, err
	}
	m, err := redshift.OpenMigrator(ctx, f.Redshift.Config(log))
	return m, flagError(err)
}

// connect opens a pool on --warehouse-url, or on databaseURL without one,
// through pooler (--database-pooler applies to both).
func (f *Flags) connect(ctx context.Context, databaseURL string, pooler cli.Pooler, poolSize int32) (*pgxpool.Pool, string, error) {
	url := f.WarehouseURL
	if url == "" {
		url = databaseURL
	}
	pool, err := cli.Connect(ctx, url, pooler, 10*time.Second, func(c *pgxpool.Config) { c.MaxConns = poolSize })
	if err != nil {
		return nil, "", fmt.Errorf("warehouse: %w", err)
	}
	return pool, url, nil
}

// describe names a Redshift target for logs.
func describe(cfg redshift.Config) string {
	target := "redshift workgroup " + cfg.WorkgroupName
	if cfg.ClusterID != "" {
		target = "redshift cluster " + cfg.ClusterID
	}
	return target + " database " + cfg.Database
}
