package metrics

import "github.com/prometheus/client_golang/prometheus"

// PausedQueues are the River queues whose ingest_queue_paused series
// exist from the start: the ingest queue and the notifications'.
var PausedQueues = []string{"fleet_ingest", "fleet_notify"}

// newRiverUI creates the River UI's request counter, registered by
// NewServe only (the worker serves no UI), and the workers' queue-paused
// gauge, registered through DatabaseStats (build): neither goes to f.
func (m *Metrics) newRiverUI() {
	m.RiverUIRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_riverui_requests_total",
		Help: "Requests to the River UI on enqueue serve's admin listener, by status code: an operator's browser, kept apart from ingest_http_requests_total (the door's requests and alerts).",
	}, []string{"code"})
	for _, code := range []string{"200", "403", "500"} {
		m.RiverUIRequests.WithLabelValues(code)
	}
	m.QueuePaused = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ingest_queue_paused",
		Help: "1 when the River queue is paused (river_queue.paused_at: the River UI's Pause, or River's QueuePause), else 0; a paused queue's jobs wait and its batches stay Running (from the database).",
	}, []string{"queue"})
	for _, q := range PausedQueues {
		m.QueuePaused.WithLabelValues(q)
	}
}
