package httpserver

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleet/ingest/internal/httpserver/httpservertest"
)

// TestReconnectingFloodDoesNotStarveAnotherListener floods one listener
// (cap 32) for 3 s with 96 reconnecting slow senders (silent, half a head,
// a body byte by byte), while a second listener of the same process, with
// a cap of its own (as enqueue serve's admin listener), is probed every
// 100 ms: every probe answers, within 5 s and most within 1 s. And the
// flood cannot make the flooded listener churn: a slot changes hands at
// most once per EvictableAfter, so the flood opens at most its clients
// plus the cap's worth of connections a second (131 to 133 of at most
// 224). Closing the longest-idle connection at once had each cut client's
// new connection cut another: the flood opened 318 to 3,209 connections in
// those 3 s on a loaded 2-core machine.
func TestReconnectingFloodDoesNotStarveAnotherListener(t *testing.T) {
	t.Parallel()
	const max, clients, floodFor = 32, 96, 3 * time.Second
	public := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) })
	}), MaxConns: max})
	admin := start(t, Config{Handler: healthMux(nil), MaxConns: 64, RefuseBodies: true, EvictableAfter: EvictableAfterProbes})

	flood, err := httpservertest.StartFlood(httpservertest.FloodConfig{
		Addr: public.Addr().String(), Clients: clients, For: floodFor,
		Heads: []string{"", "POST /read HTTP/1.1\r\nHost: x\r\nContent-Le", "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"},
	})
	require.NoError(t, err)
	t.Cleanup(flood.Stop)
	probes := httpservertest.Probe("http://"+admin.Addr().String()+"/healthz", 100*time.Millisecond, flood.Done())
	t.Logf("%d reconnecting clients for %s against a cap of %d: %d connections opened, %d evicted; the other listener's /healthz: %s",
		clients, floodFor, max, flood.Dials(), public.Evicted(), probes)

	turns := max * int64(floodFor/EvictableAfterDefault+1)
	require.LessOrEqual(t, flood.Dials(), clients+turns, "the flood opens at most its clients and the cap's worth of connections a second")
	require.LessOrEqual(t, public.Evicted(), turns)
	require.GreaterOrEqual(t, probes.Total(), 5)
	require.Empty(t, probes.Failures, "every probe of the other listener answers 200")
	require.Less(t, probes.Slowest(), 5*time.Second)
	require.GreaterOrEqual(t, probes.Within(time.Second)*10, probes.Total()*8, "at least 80%% of the probes answer within 1 s")
}
