package httpserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// start serves handler with cfg and stops it when the test ends.
func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := Listen(cfg)
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, s.Shutdown(ctx))
		require.NoError(t, <-served)
	})
	return s
}

func healthMux(extra func(*http.ServeMux)) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	if extra != nil {
		extra(mux)
	}
	return mux
}

// dial opens n connections that send nothing, closed when the test ends.
func dial(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// get sends GET path on a fresh connection and returns the status.
func get(t *testing.T, addr, path string) int {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestIdleConnectionsDoNotStarveHealthz opens ten times more silent
// connections than the cap (with timeouts far longer than the test) and
// expects /healthz to answer, the server never holding more than its cap:
// a silent connection is evicted once it has been so for EvictableAfter
// (here EvictableAfterProbes, as on the listeners of probes).
func TestIdleConnectionsDoNotStarveHealthz(t *testing.T) {
	t.Parallel()
	const max = 8
	s := start(t, Config{Handler: healthMux(nil), MaxConns: max, ReadHeaderTimeout: time.Hour, IdleTimeout: time.Hour,
		EvictableAfter: EvictableAfterProbes})
	addr := s.Addr().String()
	dial(t, addr, 10*max)
	require.Eventually(t, func() bool { return s.Evicted() >= 9*max }, 30*time.Second, 10*time.Millisecond,
		"every silent connection beyond the cap evicts an older one")
	require.LessOrEqual(t, s.ln.open(), max)
	for range 3 {
		require.Equal(t, http.StatusOK, get(t, addr, "/healthz"))
		require.LessOrEqual(t, s.ln.open(), max)
	}
}

// TestBusyConnectionsAreNeverEvicted fills the cap with requests in flight:
// a new connection waits for one to finish instead of cutting it off.
func TestBusyConnectionsAreNeverEvicted(t *testing.T) {
	t.Parallel()
	const max = 4
	release := make(chan struct{})
	var inFlight sync.WaitGroup
	inFlight.Add(max)
	s := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("GET /slow", func(w http.ResponseWriter, _ *http.Request) {
			inFlight.Done()
			<-release
			fmt.Fprintln(w, "done")
		})
	}), MaxConns: max})
	addr := s.Addr().String()

	slow := make(chan int, max)
	for range max {
		go func() { slow <- get(t, addr, "/slow") }()
	}
	inFlight.Wait()
	health := make(chan int, 1)
	go func() { health <- get(t, addr, "/healthz") }()
	select {
	case <-health:
		t.Fatal("a connection beyond the cap was served while every slot was busy")
	case <-time.After(200 * time.Millisecond):
	}
	require.Zero(t, s.Evicted(), "busy connections are never closed")
	close(release)
	for range max {
		require.Equal(t, http.StatusOK, <-slow, "every request in flight completes")
	}
	require.Equal(t, http.StatusOK, <-health, "the waiting connection is served once a slot frees")
}

// TestNewConnectionsAreNotEvictedAtOnce: at the cap, a connection that
// has not sent its whole request head yet is evictable only once it has
// been so for EvictableAfter (here an hour), so a newcomer cannot cut a
// client, a probe say, before the server has read its request — the
// first link of the churn a reconnecting flood made of eviction. The
// newcomer waits, unread, until a slot frees.
func TestNewConnectionsAreNotEvictedAtOnce(t *testing.T) {
	t.Parallel()
	s := start(t, Config{Handler: healthMux(nil), MaxConns: 1, EvictableAfter: time.Hour})
	addr := s.Addr().String()
	first := dial(t, addr, 1)[0]
	_, err := io.WriteString(first, "GET /healthz HTTP/1.1\r\n") // half a head
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.ln.open() == 1 }, 30*time.Second, 10*time.Millisecond)

	second := make(chan int, 1)
	go func() { second <- get(t, addr, "/healthz") }()
	require.Eventually(t, func() bool { return s.ln.waited.Load() >= 1 }, 30*time.Second, 10*time.Millisecond,
		"the newcomer waits at the cap instead of evicting the connection whose head is under way")
	_, err = io.WriteString(first, "Host: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(first), nil)
	require.NoError(t, err, "the first connection was not cut")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Zero(t, s.Evicted())
	select {
	case <-second:
		t.Fatal("served beyond the cap")
	default:
	}
	first.Close()
	require.Equal(t, http.StatusOK, <-second, "the newcomer is served once the slot frees")
}

// TestSlowClientsAreCutOff: a client that never finishes its headers is
// disconnected after ReadHeaderTimeout; oversized headers are refused.
func TestSlowClientsAreCutOff(t *testing.T) {
	t.Parallel()
	s := start(t, Config{Handler: healthMux(nil), ReadHeaderTimeout: 100 * time.Millisecond, MaxHeaderBytes: 4 << 10})
	addr := s.Addr().String()

	c := dial(t, addr, 1)[0]
	_, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	got, _ := io.ReadAll(c) // until the server closes the connection
	require.NotContains(t, string(got), "ok\n", "the request was never served")

	c = dial(t, addr, 1)[0]
	_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	s := start(t, Config{Handler: healthMux(nil)})
	require.Equal(t, ReadHeaderTimeoutDefault, s.http.ReadHeaderTimeout)
	require.Equal(t, ReadTimeoutDefault, s.http.ReadTimeout)
	require.Equal(t, WriteTimeoutDefault, s.http.WriteTimeout)
	require.Equal(t, IdleTimeoutDefault, s.http.IdleTimeout)
	require.Equal(t, MaxHeaderBytesDefault, s.http.MaxHeaderBytes)
	require.Equal(t, MaxConnsDefault, s.ln.max)
	require.Equal(t, BodyStallTimeoutDefault, s.stall)
	require.Equal(t, MinBodyRateDefault, s.rate)
	require.Equal(t, EvictableAfterDefault, s.ln.grace)
	_, err := Listen(Config{Addr: "127.0.0.1:0"})
	require.ErrorContains(t, err, "Handler is required")
	_, err = Listen(Config{Addr: "127.0.0.1:0", Handler: healthMux(nil), MinBodyRate: -1})
	require.ErrorContains(t, err, "must not be negative")
}

// sendHead opens a connection and sends a request head announcing a body
// of length bytes.
func sendHead(t *testing.T, addr, path string, length int) net.Conn {
	t.Helper()
	c := dial(t, addr, 1)[0]
	_, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", path, length)
	require.NoError(t, err)
	return c
}

// trickle writes one byte every interval until the server closes c, and
// returns how long that took and what the server answered.
func trickle(t *testing.T, c net.Conn, interval time.Duration) (time.Duration, string) {
	t.Helper()
	start := time.Now()
	answer := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(c) // until the server closes the connection
		answer <- string(b)
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case got := <-answer:
			return time.Since(start), got
		case <-tick.C:
			_, _ = c.Write([]byte("x"))
		case <-time.After(30 * time.Second):
			t.Fatal("the server never closed the slow connection")
		}
	}
}

// TestSlowBodiesAreCutOff: with a read timeout far longer than the test, a
// body that arrives at 10 bytes/s (below the 1 KiB/s floor), or stops,
// has its connection cut after about the stall timeout, whether the
// handler reads the body or never does; the handler sees ErrSlowBody. A
// body at a decent pace, or read late by a slow handler, is served, and
// its handler's context is not cancelled after the body ends.
func TestSlowBodiesAreCutOff(t *testing.T) {
	t.Parallel()
	const stall = 300 * time.Millisecond
	readErrs := make(chan error, 10)
	s := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Has("late") {
				time.Sleep(3 * stall) // the handler's own time does not count
			}
			b, err := io.ReadAll(r.Body)
			if err != nil {
				readErrs <- err
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			time.Sleep(3 * stall) // work after the body: the server's deadline is back
			if err := r.Context().Err(); err != nil {
				http.Error(w, "context ended after the body: "+err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintf(w, "read %d bytes", len(b))
		})
		mux.HandleFunc("POST /ignore", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no", http.StatusUnauthorized) // never reads the body
		})
	}), ReadTimeout: time.Hour, BodyStallTimeout: stall, MinBodyRate: 1 << 10})
	addr := s.Addr().String()

	took, _ := trickle(t, sendHead(t, addr, "/read", 1000), 100*time.Millisecond)
	t.Logf("a body at 10 bytes/s was cut after %s", took.Round(time.Millisecond))
	require.Less(t, took, 10*stall, "cut after about the stall timeout, not the read timeout")
	require.ErrorIs(t, <-readErrs, ErrSlowBody)

	c := sendHead(t, addr, "/read", 1000)
	_, err := c.Write([]byte(strings.Repeat("a", 500))) // half, then nothing
	require.NoError(t, err)
	took, _ = trickle(t, c, time.Hour)
	require.Less(t, took, 10*stall, "a stalled body is cut")
	require.ErrorIs(t, <-readErrs, ErrSlowBody)

	took, got := trickle(t, sendHead(t, addr, "/ignore", 1000), 100*time.Millisecond)
	require.Less(t, took, 10*stall, "a body the handler never reads is not waited for until the read timeout")
	require.Contains(t, got, "401 Unauthorized")
	require.EqualValues(t, 2, s.SlowBodiesCut(), "counted as the handler reads")

	// 64 KiB in 8 KiB pieces every 50 ms (160 KiB/s): served.
	c = sendHead(t, addr, "/read", 64<<10)
	for range 8 {
		_, err := c.Write([]byte(strings.Repeat("b", 8<<10)))
		require.NoError(t, err)
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, "read 65536 bytes", string(body))

	// The whole body at once, read by a handler that first works longer
	// than the stall timeout: served.
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err = client.Post("http://"+addr+"/read?late", "text/plain", strings.NewReader(strings.Repeat("c", 4096)))
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.EqualValues(t, 2, s.SlowBodiesCut())
}

// TestSlowBodiesDoNotHoldTheCap: connections busy only because their
// bodies trickle in are not evicted, but the floor frees their slots
// within about the stall timeout, so a probe waiting behind a full cap is
// answered.
func TestSlowBodiesDoNotHoldTheCap(t *testing.T) {
	t.Parallel()
	const max, stall = 4, 300 * time.Millisecond
	s := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) })
	}), MaxConns: max, ReadTimeout: time.Hour, BodyStallTimeout: stall})
	addr := s.Addr().String()
	for range max {
		c := sendHead(t, addr, "/read", 1000)
		go func() { _, _ = io.Copy(io.Discard, c) }()
	}
	require.Eventually(t, func() bool {
		s.ln.mu.Lock()
		defer s.ln.mu.Unlock()
		active := 0
		for c := range s.ln.conns {
			if c.state == http.StateActive {
				active++
			}
		}
		return active == max
	}, 10*time.Second, 10*time.Millisecond, "every slot is busy with a slow body")
	started := time.Now()
	require.Equal(t, http.StatusOK, get(t, addr, "/healthz"))
	require.Less(t, time.Since(started), 10*stall)
	require.Zero(t, s.Evicted(), "busy connections are not evicted")
	require.Eventually(t, func() bool { return s.SlowBodiesCut() == max }, 10*time.Second, 10*time.Millisecond)
}

// TestStalledBodiesAreEvictedAtTheCap: with the rate floor out of the way
// (an hour's stall timeout), connections whose requests wait for bodies
// that do not come are busy, but evictable once they have waited a second:
// a probe behind a full cap takes the slot of the longest stalled one.
func TestStalledBodiesAreEvictedAtTheCap(t *testing.T) {
	t.Parallel()
	const max = 4
	s := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) })
	}), MaxConns: max, ReadTimeout: time.Hour, BodyStallTimeout: time.Hour})
	addr := s.Addr().String()
	closed := make(chan struct{}, max)
	for range max {
		c := sendHead(t, addr, "/read", 1000)
		go func() {
			_, _ = io.Copy(io.Discard, c)
			closed <- struct{}{}
		}()
	}
	require.Eventually(t, func() bool {
		s.ln.mu.Lock()
		defer s.ln.mu.Unlock()
		waiting := 0
		for c := range s.ln.conns {
			if !c.waitingBody.IsZero() {
				waiting++
			}
		}
		return waiting == max
	}, 10*time.Second, 10*time.Millisecond, "every slot waits for a body")
	started := time.Now()
	require.Equal(t, http.StatusOK, get(t, addr, "/healthz"))
	took := time.Since(started)
	require.Less(t, took, EvictableAfterDefault+5*time.Second)
	require.EqualValues(t, 1, s.Evicted(), "one stalled connection made room")
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the evicted connection was not closed")
	}
	require.Zero(t, s.SlowBodiesCut(), "evicted, not cut by the floor")
}

// TestRefuseBodies: on a listener for probes and metrics, a request with
// a body is answered 413 and its connection closed at once, however slowly
// the body would come; requests without one are served.
func TestRefuseBodies(t *testing.T) {
	t.Parallel()
	s := start(t, Config{Handler: healthMux(nil), RefuseBodies: true, ReadTimeout: time.Hour, BodyStallTimeout: time.Hour})
	addr := s.Addr().String()
	c := dial(t, addr, 1)[0]
	_, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
	require.NoError(t, err)
	took, got := trickle(t, c, time.Hour)
	require.Less(t, took, 5*time.Second)
	require.Contains(t, got, "413 Request Entity Too Large")
	require.Contains(t, got, "Connection: close")
	require.NotContains(t, got, "ok\n")
	require.EqualValues(t, 1, s.SlowBodiesCut())

	c = dial(t, addr, 1)[0]
	_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n")
	require.NoError(t, err)
	_, got = trickle(t, c, time.Hour)
	require.Contains(t, got, "413 Request Entity Too Large", "a chunked body too")
	require.Equal(t, http.StatusOK, get(t, addr, "/healthz"))
}
