package metrics

import (
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Connection pool families (ingest_pgxpool_*), labelled by pool: what each
// of a process's pgx pools reports (pgxpool.Stat) at every scrape. The
// worker's pools are PoolShared, PoolRenewals and PoolLoads (the
// PostgreSQL warehouse's, when there is one); enqueue serve's PoolEnqueue
// and PoolOperator (when its operator login is a separate pool); enqueue
// sqs's and reconcile's PoolEnqueue. Names follow Prometheus' conventions
// (counters end in _total, durations are seconds, no _count suffix), which
// the pgxpool collectors published for pgx (pgxpool_acquire_count,
// pgxpool_acquire_duration_ns, …) do not.
const (
	PoolShared   = "shared"
	PoolRenewals = "renewals"
	PoolLoads    = "loads"
	PoolEnqueue  = "enqueue"
	PoolOperator = "operator"
)

// AddPool exports pool's statistics under pool=name on m's registry. A
// name already added is replaced.
func (m *Metrics) AddPool(name string, pool *pgxpool.Pool) {
	m.poolsOnce.Do(func() {
		m.pools = newPoolCollector()
		m.Registry.MustRegister(m.pools)
	})
	m.pools.add(name, pool)
}

type poolDesc struct {
	desc      *prometheus.Desc
	valueType prometheus.ValueType
	value     func(*pgxpool.Stat) float64
}

// poolCollector collects the statistics of named pools.
type poolCollector struct {
	descs []poolDesc

	mu    sync.Mutex
	pools map[string]*pgxpool.Pool
}

func newPoolCollector() *poolCollector {
	d := func(name, help string, t prometheus.ValueType, v func(*pgxpool.Stat) float64) poolDesc {
		return poolDesc{prometheus.NewDesc("ingest_pgxpool_"+name, help, []string{"pool"}, nil), t, v}
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	return &poolCollector{pools: map[string]*pgxpool.Pool{}, descs: []poolDesc{
		d("acquired_connections", "Connections of the pool in use now (acquired).", gauge,
			func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }),
		d("idle_connections", "Connections of the pool open and idle now.", gauge,
			func(s *pgxpool.Stat) float64 { return float64(s.IdleConns()) }),
		d("constructing_connections", "Connections of the pool being opened now.", gauge,
			func(s *pgxpool.Stat) float64 { return float64(s.ConstructingConns()) }),
		d("total_connections", "Connections of the pool now: acquired, idle and being opened.", gauge,
			func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }),
		d("max_connections", "Most connections the pool opens (its share of --max-conns).", gauge,
			func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }),
		d("acquires_total", "Connections acquired from the pool.", counter,
			func(s *pgxpool.Stat) float64 { return float64(s.AcquireCount()) }),
		d("acquire_duration_seconds_total", "Time spent acquiring connections from the pool, summed over the acquires (divide its rate by ingest_pgxpool_acquires_total's for the mean wait).", counter,
			func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }),
		d("empty_acquires_total", "Acquires that found no idle connection and waited for one to be released or opened: the pool was exhausted.", counter,
			func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }),
		d("empty_acquire_wait_seconds_total", "Time acquires spent waiting because the pool had no idle connection.", counter,
			func(s *pgxpool.Stat) float64 { return s.EmptyAcquireWaitTime().Seconds() }),
		d("canceled_acquires_total", "Acquires given up because their context ended (a timeout, a client gone) before a connection was free.", counter,
			func(s *pgxpool.Stat) float64 { return float64(s.CanceledAcquireCount()) }),
		d("new_connections_total", "Connections the pool opened.", counter,
			func(s *pgxpool.Stat) float64 { return float64(s.NewConnsCount()) }),
		d("idle_closed_connections_total", "Connections the pool closed because they were idle too long.", counter,
			func(s *pgxpool.Stat) float64 { return float64(s.MaxIdleDestroyCount()) }),
		d("lifetime_closed_connections_total", "Connections the pool closed because they reached their maximum lifetime.", counter,
			func(s *pgxpool.Stat) float64 { return float64(s.MaxLifetimeDestroyCount()) }),
	}}
}

func (c *poolCollector) add(name string, pool *pgxpool.Pool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pools[name] = pool
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d.desc
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	stats := make(map[string]*pgxpool.Stat, len(c.pools))
	for name, p := range c.pools {
		stats[name] = p.Stat()
	}
	c.mu.Unlock()
	for name, s := range stats {
		for _, d := range c.descs {
			ch <- prometheus.MustNewConstMetric(d.desc, d.valueType, d.value(s), name)
		}
	}
}
