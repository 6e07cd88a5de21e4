package redshift

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/redshiftdata"
	"github.com/aws/aws-sdk-go-v2/service/redshiftdata/types"

	"github.com/fleet/ingest/migrations"
)

// Migrator applies the warehouse schema (migrations/warehouse/redshift). It
// needs only the target settings of Config (workgroup or cluster, database,
// secret or database user).
type Migrator struct {
	dataAPI
}

// OpenMigrator returns a Migrator with a Data API client from the standard
// AWS configuration chain (see Open).
func OpenMigrator(ctx context.Context, cfg Config) (*Migrator, error) {
	if err := cfg.ValidateTarget(); err != nil {
		return nil, err
	}
	awsCfg, err := loadAWS(ctx)
	if err != nil {
		return nil, err
	}
	return NewMigrator(cfg, redshiftdata.NewFromConfig(awsCfg))
}

// NewMigrator returns a Migrator on the given client.
func NewMigrator(cfg Config, data *redshiftdata.Client) (*Migrator, error) {
	if err := cfg.ValidateTarget(); err != nil {
		return nil, err
	}
	return &Migrator{dataAPI{cfg: cfg.withDefaults(), data: data}}, nil
}

// Applied is one warehouse migration Migrate applied.
type Applied struct {
	Version  int64
	Name     string
	Duration time.Duration
}

// Migrate brings schema curated to the current version: it creates the
// version table curated.fleet_warehouse_migrations if needed, then applies
// each pending file of migrations/warehouse/redshift in one transaction
// with its version row. A transaction re-checks the version under a lock,
// so concurrent migrators apply each file once. Idempotent: on a current
// warehouse it applies nothing.
func (w *dataAPI) Migrate(ctx context.Context) ([]Applied, error) {
	files, err := migrations.RedshiftWarehouse()
	if err != nil {
		return nil, err
	}
	if err := w.exec(ctx, "fleet-migrate-bootstrap", bootstrapSQL); err != nil {
		return nil, fmt.Errorf("creating the migrations table: %w", err)
	}
	done, err := w.appliedVersions(ctx)
	if err != nil {
		return nil, err
	}
	var applied []Applied
	for _, m := range files {
		if done[m.Version] {
			continue
		}
		start := time.Now()
		sqls, err := migrationSQL(m.Version, m.Name, m.Statements)
		if err != nil {
			return applied, err
		}
		err = w.exec(ctx, "fleet-migrate-"+strconv.FormatInt(m.Version, 10), sqls)
		if err != nil {
			if now, rerr := w.appliedVersions(ctx); rerr == nil && now[m.Version] {
				continue // a concurrent migrator applied it
			}
			return applied, fmt.Errorf("applying %s: %w", m.Name, err)
		}
		applied = append(applied, Applied{Version: m.Version, Name: m.Name, Duration: time.Since(start)})
	}
	return applied, nil
}

func (w *dataAPI) appliedVersions(ctx context.Context) (map[int64]bool, error) {
	rows, err := w.query(ctx, "fleet-migrate-versions", appliedMigrations)
	if err != nil {
		return nil, fmt.Errorf("reading applied migrations: %w", err)
	}
	done := map[int64]bool{}
	for _, r := range rows {
		v, err := fieldInt(r[0])
		if err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, nil
}

// exec runs statements as one transaction and waits for it.
func (w *dataAPI) exec(ctx context.Context, name string, sqls []string) error {
	return w.execParams(ctx, name, sqls, nil)
}

// execParams is exec with parameters, for tests (a batch of SELECT, INSERT,
// UPDATE and DELETE only, where the Data API documents them).
func (w *dataAPI) execParams(ctx context.Context, name string, sqls []string, p []types.SqlParameter) error {
	ctx, done := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer done()
	id, err := w.submitBatch(ctx, name, sqls, p, "")
	if err != nil {
		return err
	}
	d, err := w.await(ctx, id, w.cfg.QueryTimeout, w.cfg.PollInterval, w.cfg.PollMax)
	if err != nil {
		return err
	}
	return interpretStatement(d)
}
