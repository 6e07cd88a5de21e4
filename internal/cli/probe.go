package cli

import (
	"errors"
	"time"
)

// DatabaseProbeFlags is the flag of the long-running commands (worker run,
// enqueue serve, enqueue sqs, enqueue reconcile --every), which export
// whether they reach their operational database (ingest_database_up) and
// answer /readyz from it: how often they probe it (dbhealth.Monitor.Run).
// Its default is dbhealth.ProbeIntervalDefault.
type DatabaseProbeFlags struct {
	DatabaseProbeInterval time.Duration `name:"database-probe-interval" env:"DATABASE_PROBE_INTERVAL" default:"10s" help:"How often this process checks that it reaches its operational database: SELECT 1 on its pool (through a pooler too), answered within 5s (or this interval, if shorter); any query that succeeds counts as well. ingest_database_up, ingest_database_last_success_timestamp_seconds and /readyz follow it: down after a probe that failed, or when nothing succeeded for three intervals. At least 1s."`
}

// Validate refuses an interval under a second.
func (f DatabaseProbeFlags) Validate() error {
	if f.DatabaseProbeInterval < time.Second {
		return errors.New("--database-probe-interval must be at least 1s")
	}
	return nil
}
