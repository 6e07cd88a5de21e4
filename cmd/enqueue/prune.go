package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fleet/ingest/internal/cli"
	"github.com/fleet/ingest/internal/grants"
	"github.com/fleet/ingest/internal/jobs"
	"github.com/fleet/ingest/internal/retention"
)

// age is a retention period: a Go duration (720h) or a number of days (30d).
type age time.Duration

// UnmarshalText implements encoding.TextUnmarshaler, for kong.
func (a *age) UnmarshalText(text []byte) error {
	s := string(text)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 36500 {
			return fmt.Errorf("%q: a number of days (30d) or a duration (720h)", s)
		}
		*a = age(time.Duration(n) * 24 * time.Hour)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: a number of days (30d) or a duration (720h)", s)
	}
	*a = age(d)
	return nil
}

type pruneCmd struct {
	OlderThan         age           `name:"older-than" required:"" help:"Prune batches that completed longer ago than this: days (90d) or a duration (2160h); at least 1d."`
	Apply             bool          `name:"apply" help:"Delete. Without it, a dry run: prints what would be deleted (counts by status, the id range) and deletes nothing."`
	BatchSize         int           `name:"batch-size" default:"1000" help:"Delete at most this many batches per transaction."`
	LockTimeout       time.Duration `name:"lock-timeout" default:"2s" help:"PostgreSQL lock_timeout of each transaction: a transaction that waits longer for a lock (a batch being changed) gives way, is tried again (--lock-retries), then its batches are skipped until the next run."`
	LockRetries       int           `name:"lock-retries" default:"3" help:"How many times a transaction that gave way to a lock is tried again before its batches are skipped."`
	PublicationWindow time.Duration `name:"publication-window" env:"PUBLICATION_WINDOW" default:"24h" help:"A failed publication committed less than this long ago can still be resumed: it is kept."`
	// Who prunes (the database login) and why: every transaction that
	// deletes records them in the operators' audit.
	operator
}

// Run prunes the batch history (internal/retention) and prints one JSON
// line: would_prune (a dry run) or pruned, with the counts.
func (p *pruneCmd) Run(c *enqueueCLI, e *cli.Env) error {
	cfg := retention.Config{
		OlderThan: time.Duration(p.OlderThan), Apply: p.Apply, BatchSize: p.BatchSize,
		LockTimeout: p.LockTimeout, LockRetries: p.LockRetries, PublicationWindow: p.PublicationWindow,
		Logger: e.Logger.With("command", "prune"),
	}
	switch {
	case p.BatchSize < 1:
		return invalid(e, &jobs.InputError{Field: "batch_size", Reason: "must be at least 1"})
	case p.LockTimeout <= 0:
		return invalid(e, &jobs.InputError{Field: "lock_timeout", Reason: "must be positive"})
	case p.LockRetries < 0:
		return invalid(e, &jobs.InputError{Field: "lock_retries", Reason: "must not be negative"})
	case p.PublicationWindow <= 0:
		return invalid(e, &jobs.InputError{Field: "publication_window", Reason: "must be positive"})
	}
	if p.LockRetries == 0 {
		cfg.LockRetries = -1 // retention's zero is its default
	}
	var in *retention.InputError
	if err := cfg.Validate(); errors.As(err, &in) {
		return invalid(e, &jobs.InputError{Field: in.Field, Reason: in.Reason})
	}
	if err := p.checkOperator(); err != nil {
		return invalid(e, err)
	}
	pool, err := connect(c, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The login holds what roles.sql grants the operators, or nothing is
	// pruned (exit 10, naming what is missing).
	if err := requireGrants(e, pool, grants.Operator); err != nil {
		return err
	}
	cfg.Pool, cfg.Reason = pool, p.Reason
	ctx, cancel := context.WithTimeout(e.Ctx, c.Timeout)
	cfg.Actor, err = p.actor(ctx, pool)
	cancel()
	if err != nil {
		return err
	}
	// No --timeout: a prune takes as long as its transactions, each bounded
	// by --lock-timeout; SIGTERM stops it between two.
	res, err := retention.Prune(e.Ctx, cfg)
	if err != nil {
		return err
	}
	outcome := "would_prune"
	if res.Applied {
		outcome = "pruned"
	}
	printJSON(e.Stdout, struct {
		Outcome   string `json:"outcome"`
		OlderThan string `json:"older_than"`
		retention.Result
	}{outcome, time.Duration(p.OlderThan).String(), res})
	return nil
}
