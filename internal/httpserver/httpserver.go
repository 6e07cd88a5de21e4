// Package httpserver builds the HTTP listeners of both binaries — the
// worker's /metrics, /healthz and /readyz, and enqueue serve's upload API —
// with the same protections, so no listener is softer than another:
//
//   - read, read-header, write and idle timeouts and a header size bound,
//     so a client that sends slowly, or not at all, holds nothing for long;
//   - a cap on open connections, far below the process's file descriptor
//     limit, so a flood of connections cannot starve the process of the
//     descriptors its database pools and source folders need.
//
// At the cap, a new connection closes the connection that has been idle
// longest (one that has sent nothing yet, or is between requests), never
// one in the middle of a request; only when every connection is busy does
// it wait for one to finish. So a flood of idle connections cannot lock out
// a kubelet probe or a Prometheus scrape: they get the slot of the oldest
// idle connection.
package httpserver

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	ReadHeaderTimeoutDefault = 5 * time.Second
	ReadTimeoutDefault       = 15 * time.Second
	WriteTimeoutDefault      = 45 * time.Second
	IdleTimeoutDefault       = 60 * time.Second
	MaxHeaderBytesDefault    = 64 << 10
	MaxConnsDefault          = 256
)

// Config configures a listener.
type Config struct {
	// Addr is the TCP address to listen on, such as ":9090" or
	// "127.0.0.1:0".
	Addr    string
	Handler http.Handler
	// ReadHeaderTimeout bounds reading a request's headers, and how long a
	// new connection may stay silent. Defaults to 5 s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request. Defaults to 15 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its headers to the end
	// of the answer. Defaults to 45 s.
	WriteTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a kept-alive
	// connection. Defaults to 60 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds request headers. Defaults to 64 KiB.
	MaxHeaderBytes int
	// MaxConns caps open connections. Defaults to 256.
	MaxConns int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server is a listening HTTP server.
type Server struct {
	http *http.Server
	ln   *limitListener
}

// Listen binds cfg.Addr and returns the server, not yet serving.
func Listen(cfg Config) (*Server, error) {
	if cfg.Handler == nil {
		return nil, errors.New("httpserver: Handler is required")
	}
	if cfg.MaxConns < 0 || cfg.MaxHeaderBytes < 0 {
		return nil, errors.New("httpserver: MaxConns and MaxHeaderBytes must not be negative")
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	logger := cmp.Or(cfg.Logger, slog.Default())
	ll := newLimitListener(ln, cmp.Or(cfg.MaxConns, MaxConnsDefault))
	return &Server{
		ln: ll,
		http: &http.Server{
			Handler:           cfg.Handler,
			ReadHeaderTimeout: cmp.Or(cfg.ReadHeaderTimeout, ReadHeaderTimeoutDefault),
			ReadTimeout:       cmp.Or(cfg.ReadTimeout, ReadTimeoutDefault),
			WriteTimeout:      cmp.Or(cfg.WriteTimeout, WriteTimeoutDefault),
			IdleTimeout:       cmp.Or(cfg.IdleTimeout, IdleTimeoutDefault),
			MaxHeaderBytes:    cmp.Or(cfg.MaxHeaderBytes, MaxHeaderBytesDefault),
			ConnState:         ll.track,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		},
	}, nil
}

// Addr returns the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Shutdown and then returns nil, or returns the error
// that stopped it.
func (s *Server) Serve() error {
	if err := s.http.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting, closes idle connections and waits for requests
// in flight until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }

// Evicted returns how many idle connections were closed to make room for
// new ones.
func (s *Server) Evicted() int64 { return s.ln.evicted.Load() }

// limitListener caps open connections; see the package documentation.
type limitListener struct {
	net.Listener
	max     int
	freed   chan struct{} // a connection closed (buffered 1: Accept is the only waiter)
	done    chan struct{} // the listener closed
	once    sync.Once
	evicted atomic.Int64

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func newLimitListener(ln net.Listener, max int) *limitListener {
	return &limitListener{
		Listener: ln, max: max,
		freed: make(chan struct{}, 1), done: make(chan struct{}),
		conns: make(map[*trackedConn]struct{}, max),
	}
}

// trackedConn is a connection counted by its listener.
type trackedConn struct {
	net.Conn
	l        *limitListener
	released sync.Once
	// Guarded by l.mu.
	state http.ConnState
	since time.Time
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

func (c *trackedConn) release() {
	c.released.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		select {
		case c.l.freed <- struct{}{}:
		default:
		}
	})
}

// Accept returns the next connection, making room for it first.
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		l.mu.Lock()
		if len(l.conns) < l.max {
			tc := &trackedConn{Conn: c, l: l, state: http.StateNew, since: time.Now()}
			l.conns[tc] = struct{}{}
			l.mu.Unlock()
			return tc, nil
		}
		victim := l.idlestLocked()
		l.mu.Unlock()
		if victim != nil {
			l.evicted.Add(1)
			_ = victim.Close()
			continue
		}
		select {
		case <-l.freed:
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
}

// idlestLocked returns the connection idle the longest (new and silent, or
// between requests), or nil when all are busy.
func (l *limitListener) idlestLocked() *trackedConn {
	var victim *trackedConn
	for c := range l.conns {
		if (c.state == http.StateNew || c.state == http.StateIdle) && (victim == nil || c.since.Before(victim.since)) {
			victim = c
		}
	}
	return victim
}

// track follows the server's view of each connection.
func (l *limitListener) track(c net.Conn, state http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	if state == http.StateClosed {
		tc.release()
		return
	}
	l.mu.Lock()
	tc.state, tc.since = state, time.Now()
	l.mu.Unlock()
}

func (l *limitListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}
