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
// expects /healthz to answer at once, the server never holding more than
// its cap.
func TestIdleConnectionsDoNotStarveHealthz(t *testing.T) {
	t.Parallel()
	const max = 8
	s := start(t, Config{Handler: healthMux(nil), MaxConns: max, ReadHeaderTimeout: time.Hour, IdleTimeout: time.Hour})
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
	_, err := Listen(Config{Addr: "127.0.0.1:0"})
	require.ErrorContains(t, err, "Handler is required")
}
