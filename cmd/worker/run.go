package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/alecthomas/kong"

	"github.com/fleet/ingest/internal/batch"
	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/warehouse"
	"github.com/fleet/ingest/internal/warehouse/warehousecli"
	"github.com/fleet/ingest/migrations"
)

type workerCLI struct {
	cli.Globals

	Run     runCmd     `cmd:"" default:"withargs" help:"Run River workers for Fleet ingest jobs (the default command)."`
	Migrate migrateCmd `cmd:"" help:"Apply the project's and River's migrations and the warehouse schema (local PostgreSQL, or Redshift with --warehouse redshift), idempotently, and print what was applied."`
}

// run is the whole program, testable in-process: it parses args, runs the
// command and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c workerCLI
	kctx, code, ok := cli.Parse(&c, args, stdout, stderr, "worker",
		"Fleet ingestion worker: runs River jobs that load Fleet folders into the warehouse.", kong.Vars{}, cli.JSONLog(stderr))
	if !ok {
		return code
	}
	e := &cli.Env{Ctx: ctx, Stdout: stdout, Stderr: stderr, Logger: c.Logger(stderr)}
	if err := kctx.Run(&c.Globals, e); err != nil {
		var coded cli.ExitError
		if errors.As(err, &coded) {
			e.Logger.Error(coded.Error())
			return coded.Code
		}
		e.Logger.Error(cli.MigrateHint(err).Error())
		return cli.ExitInfra
	}
	return cli.ExitOK
}

type migrateCmd struct {
	SkipWarehouse bool          `name:"skip-warehouse" help:"Apply only the operational database's migrations (project and River), not the warehouse schema."`
	Timeout       time.Duration `default:"5m" help:"Give up after this long."`
	LockTimeout   time.Duration `name:"lock-timeout" env:"MIGRATE_LOCK_TIMEOUT" default:"5s" help:"How long one migration statement waits for a lock (PostgreSQL lock_timeout) before it gives way, so lease renewals never queue behind it for longer; it is retried (--lock-attempts) and the session it waited for is logged."`
	LockAttempts  int           `name:"lock-attempts" env:"MIGRATE_LOCK_ATTEMPTS" default:"10" help:"How many times migrations that gave way to a lock are tried (backoff 1 s doubling to 30 s) before worker migrate exits 6 naming the blocking session."`

	warehousecli.Flags
}

func (m *migrateCmd) Run(g *cli.Globals, e *cli.Env) error {
	if err := m.Flags.Validate(false); err != nil {
		return warehousecli.ExitError(err)
	}
	if m.LockTimeout <= 0 || m.LockTimeout > time.Minute {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--lock-timeout: must be positive and at most 1m")}
	}
	if m.LockAttempts < 1 || m.LockAttempts > 1000 {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--lock-attempts: must be between 1 and 1000")}
	}
	if g.DatabasePooler.Transactional() {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: errors.New("--database-pooler: worker migrate needs a direct connection to PostgreSQL " +
			"(it holds a session advisory lock and session settings for its whole run, which a pooler in transaction mode would drop): " +
			"run it with --database-pooler none and a DATABASE_URL that bypasses the pooler")}
	}
	cfg := migrations.Config{LockTimeout: m.LockTimeout, LockAttempts: m.LockAttempts, Logger: e.Logger}
	err := m.apply(g, e, cfg)
	var lte *migrations.LockTimeoutError
	if errors.As(err, &lte) {
		return cli.ExitError{Code: cli.ExitLockTimeout, Err: err}
	}
	return err
}

func (m *migrateCmd) apply(g *cli.Globals, e *cli.Env, cfg migrations.Config) error {
	ctx, cancel := context.WithTimeout(e.Ctx, m.Timeout)
	defer cancel()
	pool, err := g.Connect(ctx, 10*time.Second, nil)
	if errors.Is(err, cli.ErrNoDatabaseURL) {
		return cli.ExitError{Code: cli.ExitInvalidInput, Err: err}
	}
	if err != nil {
		return err
	}
	defer pool.Close()
	report, err := cfg.Apply(ctx, pool)
	if err != nil {
		return err
	}
	for _, a := range report.Project {
		fmt.Fprintf(e.Stdout, "applied project migration %d %s (%s)\n", a.Version, a.Source, a.Duration.Round(time.Millisecond))
	}
	for _, v := range report.River {
		fmt.Fprintf(e.Stdout, "applied River migration %d %s (%s)\n", v.Version, v.Name, v.Duration.Round(time.Millisecond))
	}
	var bound warehouse.IDBound // the warehouse, to move the id sequence past its batch ids
	switch {
	case m.SkipWarehouse:
	case m.IsRedshift():
		migrator, err := m.OpenMigrator(ctx, e.Logger)
		if err != nil {
			return warehousecli.ExitError(err)
		}
		bound = migrator
		applied, err := migrator.Migrate(ctx)
		for _, a := range applied {
			report.Warehouse = append(report.Warehouse, migrations.Applied{Version: a.Version, Source: "redshift/" + a.Name, Duration: a.Duration})
		}
		if err != nil {
			return fmt.Errorf("redshift warehouse: %w", err)
		}
	default:
		whPool := pool
		if m.WarehouseURL != "" && m.WarehouseURL != g.DatabaseURL {
			if whPool, err = cli.Connect(ctx, m.WarehouseURL, cli.PoolerNone, 10*time.Second, nil); err != nil {
				return fmt.Errorf("warehouse: %w", err)
			}
			defer whPool.Close()
		}
		if report.Warehouse, err = cfg.ApplyWarehouse(ctx, whPool); err != nil {
			return fmt.Errorf("warehouse: %w", err)
		}
		bound = warehouse.NewPostgres(whPool)
	}
	for _, a := range report.Warehouse {
		fmt.Fprintf(e.Stdout, "applied warehouse migration %d %s (%s)\n", a.Version, a.Source, a.Duration.Round(time.Millisecond))
	}
	if len(report.Project)+len(report.River)+len(report.Warehouse) == 0 {
		fmt.Fprintln(e.Stdout, "database schema is current: nothing to apply")
	}
	if bound != nil {
		// After a restore or a failover behind the warehouse the id
		// sequence is behind the ids the warehouse names: move it past
		// them, so no batch is handed one of them again.
		named, err := bound.MaxBatchID(ctx, true)
		if err != nil {
			return fmt.Errorf("warehouse: %w", err)
		}
		last, err := batch.NewStore(pool).AdvanceIDs(ctx, named)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.Stdout, "batch ids: the warehouse names batches up to %d; the id sequence stands at %d\n", named, last)
		e.Logger.Info("batch id sequence checked against the warehouse", "warehouse_max_batch_id", named, "sequence_last_value", last)
	}
	e.Logger.Info("migrations applied", "project", len(report.Project), "river", len(report.River), "warehouse", len(report.Warehouse))
	return nil
}
