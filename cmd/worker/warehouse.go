package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/redshift"
)

// Warehouse kinds.
const (
	warehousePostgres = "postgres"
	warehouseRedshift = "redshift"
)

// warehouseFlags choose and configure the warehouse, for run and migrate.
type warehouseFlags struct {
	Warehouse    string        `name:"warehouse" env:"WAREHOUSE" enum:"postgres,redshift" default:"postgres" help:"Where Fleet folders are loaded: postgres (schema curated in a PostgreSQL database: local and development) or redshift (Amazon Redshift through the Data API: production)."`
	WarehouseURL string        `name:"warehouse-url" env:"WAREHOUSE_URL" help:"With --warehouse postgres: connection string of the warehouse database (schema curated). Defaults to the operational database."`
	Redshift     redshiftFlags `embed:"" prefix:"redshift-" envprefix:"REDSHIFT_" group:"Redshift (--warehouse redshift; AWS credentials and AWS_REGION from the standard AWS configuration chain)"`
}

// redshiftFlags are the settings of redshift.Config.
type redshiftFlags struct {
	Workgroup    string        `name:"workgroup" env:"WORKGROUP" help:"Redshift Serverless workgroup holding the warehouse (or --redshift-cluster-id)."`
	ClusterID    string        `name:"cluster-id" env:"CLUSTER_ID" help:"Provisioned Redshift cluster identifier (or --redshift-workgroup)."`
	Database     string        `name:"database" env:"DATABASE" help:"Database holding schema curated."`
	SecretARN    string        `name:"secret-arn" env:"SECRET_ARN" help:"Secrets Manager secret (ARN or name) with the database user's credentials. Without it or --redshift-db-user, the database user is derived from the worker's IAM identity."`
	DBUser       string        `name:"db-user" env:"DB_USER" help:"Database user for temporary credentials (redshift:GetClusterCredentials); provisioned clusters only."`
	IAMRole      string        `name:"iam-role" env:"IAM_ROLE" help:"IAM role Redshift assumes to read the staging objects during COPY: a role ARN associated with the workgroup or cluster, or \"default\" for its default role. Not needed by migrate."`
	Staging      string        `name:"staging" env:"STAGING" help:"Where loads are staged: s3://bucket/prefix/ (letters, digits, _ . / = - only), in the warehouse's region; objects are deleted once their batch's commit is confirmed, and a lifecycle rule on the prefix is the backstop. Not needed by migrate."`
	LoadTimeout  time.Duration `name:"load-timeout" env:"LOAD_TIMEOUT" default:"1h" help:"How long a load's transaction is awaited; after it the stamp is read back and the batch retried if it did not commit (the statement is not cancelled)."`
	QueryTimeout time.Duration `name:"query-timeout" env:"QUERY_TIMEOUT" default:"2m" help:"How long a stamp read, a publication or a migration is awaited."`
}

// set reports whether any Redshift setting was given.
func (r redshiftFlags) set() bool {
	return r.Workgroup != "" || r.ClusterID != "" || r.Database != "" || r.SecretARN != "" || r.DBUser != "" || r.IAMRole != "" || r.Staging != ""
}

func (r redshiftFlags) config(log *slog.Logger) redshift.Config {
	return redshift.Config{
		WorkgroupName: r.Workgroup, ClusterID: r.ClusterID, Database: r.Database, SecretARN: r.SecretARN, DBUser: r.DBUser,
		IAMRole: r.IAMRole, Staging: r.Staging, LoadTimeout: r.LoadTimeout, QueryTimeout: r.QueryTimeout, Logger: log,
	}
}

// invalid wraps a configuration error in the invalid-input exit code,
// naming the flag.
func invalid(err error) error {
	var ce *redshift.ConfigError
	if errors.As(err, &ce) {
		if ce.Field == "region" {
			err = fmt.Errorf("AWS_REGION: %s", ce.Reason)
		} else {
			err = fmt.Errorf("--redshift-%s: %s", ce.Field, ce.Reason)
		}
	}
	return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
}

// validate checks the settings before anything connects: the Redshift ones
// need --warehouse redshift, and the other way round. Loading needs every
// Redshift setting; migrating only those naming the warehouse.
func (f *warehouseFlags) validate(loading bool) error {
	switch f.Warehouse {
	case warehouseRedshift:
		if f.WarehouseURL != "" {
			return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--warehouse-url is for --warehouse postgres; Redshift is reached through the Data API (--redshift-*)")}
		}
		if f.Redshift.LoadTimeout <= 0 || f.Redshift.QueryTimeout <= 0 {
			return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--redshift-load-timeout and --redshift-query-timeout must be positive")}
		}
		cfg := f.Redshift.config(nil)
		validate := cfg.ValidateTarget
		if loading {
			validate = cfg.Validate
		}
		if err := validate(); err != nil {
			return invalid(err)
		}
	default:
		if f.Redshift.set() {
			return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--redshift-* settings need --warehouse redshift")}
		}
	}
	return nil
}

// open returns the warehouse to load into and a function releasing it. The
// PostgreSQL warehouse gets a pool of poolSize connections.
func (f *warehouseFlags) open(ctx context.Context, databaseURL string, poolSize int32, log *slog.Logger) (warehouse.Warehouse, string, func(), error) {
	if err := f.validate(true); err != nil {
		return nil, "", nil, err
	}
	if f.Warehouse == warehouseRedshift {
		cfg := f.Redshift.config(log)
		wh, err := redshift.Open(ctx, cfg)
		var ce *redshift.ConfigError
		if errors.As(err, &ce) {
			return nil, "", nil, invalid(err)
		}
		if err != nil {
			return nil, "", nil, err
		}
		target := "redshift workgroup " + cfg.WorkgroupName
		if cfg.ClusterID != "" {
			target = "redshift cluster " + cfg.ClusterID
		}
		return wh, target + " database " + cfg.Database + " staging " + cfg.Staging, func() {}, nil
	}
	url := f.WarehouseURL
	if url == "" {
		url = databaseURL
	}
	pool, err := cli.Connect(ctx, url, 10*time.Second, func(c *pgxpool.Config) { c.MaxConns = poolSize })
	if err != nil {
		return nil, "", nil, fmt.Errorf("warehouse: %w", err)
	}
	return warehouse.NewPostgres(pool), "postgres " + cli.Redact(url), pool.Close, nil
}
