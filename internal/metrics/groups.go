package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// ImportGroups are the metrics of group commit (jobs.Grouper): concurrent
// imports that share one burst transaction.
type ImportGroups struct {
	// Size is the folders of each group transaction.
	Size prometheus.Histogram
	// Commits counts the group transactions that committed.
	Commits prometheus.Counter
	// Fallbacks counts the groups whose transaction failed and whose
	// requests were then imported one by one.
	Fallbacks prometheus.Counter
	// Waiting is the requests gathered for the next group, waiting for
	// the transaction in flight to end or for the linger.
	Waiting prometheus.Gauge
}

// ImportGroupSizeBuckets bound the group-size histogram: a group holds at
// most jobs.MaxBurst folders (enqueue serve: --group-max, 100 by default).
var ImportGroupSizeBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 100, 200, 500, 1000}

// NewImportGroups creates the group-commit metrics and registers them with
// reg; metrics reg already holds (a second server on the same registry)
// are shared, not registered twice.
func NewImportGroups(reg prometheus.Registerer) *ImportGroups {
	g := &ImportGroups{
		Size: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ingest_import_group_size", Help: "Folders per group-commit transaction: concurrent imports sharing one reservation statement, one job insert and one commit.",
			Buckets: ImportGroupSizeBuckets,
		}),
		Commits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ingest_import_group_commits_total", Help: "Group-commit transactions that committed (each answers every import of its group).",
		}),
		Fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ingest_import_group_fallbacks_total", Help: "Groups whose shared transaction failed and whose imports were then tried one request at a time, so no folder fails another request.",
		}),
		Waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ingest_import_group_waiting", Help: "Import requests gathered for the next group-commit transaction (waiting for the one in flight to end, or for --group-linger).",
		}),
	}
	g.Size = registerOrShare(reg, g.Size)
	g.Commits = registerOrShare(reg, g.Commits)
	g.Fallbacks = registerOrShare(reg, g.Fallbacks)
	g.Waiting = registerOrShare(reg, g.Waiting)
	return g
}

// registerOrShare registers c, or returns the collector reg already holds
// under its name.
func registerOrShare[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}
