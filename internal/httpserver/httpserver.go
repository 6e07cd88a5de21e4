// Package httpserver builds the HTTP listeners of both binaries — the
// worker's /metrics, /healthz and /readyz, and enqueue serve's upload API
// and its admin listener — with the same protections, so no listener is
// softer than another:
//
//   - read, read-header, write and idle timeouts and a header size bound,
//     so a client that sends slowly, or not at all, holds nothing for long;
//   - a floor on the rate at which a request body arrives (BodyStallTimeout,
//     MinBodyRate): a body whose next bytes take longer than the stall
//     timeout, or that averages less than the minimum rate after that
//     grace, has its connection cut within seconds, not at the read
//     timeout. Only the time the handler spends waiting for the body
//     counts, so a slow handler never cuts its own client;
//   - a refusal (any answer of 400 or more) of a request whose body has
//     not arrived yet is sent at once, with Connection: close, without
//     reading the rest of the body: a client refused 401, 404, 405 or 413
//     is not kept waiting, nor is its connection kept busy, while a body
//     nobody will read trickles in (net/http reads up to 256 KiB of an
//     unread body before it answers, for as long as its client takes);
//   - for listeners whose routes take no body (probes and metrics),
//     RefuseBodies, or RefuseBodiesOn for some paths of a listener: a
//     request with a body is answered 413 and its connection closed at
//     once, so no client can keep a connection there busy by sending a
//     body slowly;
//   - a cap on open connections of its own, far below the process's file
//     descriptor limit (which Go raises to the hard limit at start), so a
//     flood of connections cannot starve the process of the descriptors
//     its database pools and source folders need, and a flood of one
//     listener never takes the connections of another.
//
// At the cap, a new connection closes the connection that has been idle
// longest (one that has not sent a whole request head yet, or is between
// requests), or else the one whose request has waited longest for more of
// its body — but only once it has been so for Config.EvictableAfter;
// never one whose handler is at work. A connection whose request was
// refused, answered and lingering before it closes (net/http waits up to
// half a second so that the answer is not lost to a reset) is closed at
// once for a newcomer. Until one has, the new connection
// waits, unread, and those behind it wait in the kernel's accept queue,
// costing nothing. So a flood of idle connections cannot lock out a
// kubelet probe or a Prometheus scrape for long: they get the slot of the
// oldest idle connection; nor can a flood of slow senders, whose
// connections are evictable while they stall and cut by the body rate
// floor anyway. On a listener that refuses bodies no connection is busy
// for longer than its handler runs. Probes belong on such a listener,
// apart from any port the public reaches: enqueue serve's --admin-listen,
// the worker's --metrics-addr.
//
// EvictableAfter is what keeps a flood from turning eviction into a loop.
// When any idle connection could be closed at once (a new one counting as
// idle until its request head is whole), a flood whose clients reconnect
// as soon as they are cut had each new connection cut another, whose
// client came back and cut the next: up to thousands of connections a
// second on two cores, whose CPU (the server's, the kernel's, and on one
// machine the clients') slowed every listener of the machine, and which
// cut the port's own probes before the server had read them. With
// EvictableAfterDefault (a second), for a port the public reaches, a slot
// changes hands at most once a second, so a flood of any size opens at
// most MaxConns connections a second; the price is that a caller of that
// port queued behind a flood of F connections waits about
// (F - MaxConns) / MaxConns seconds. A listener of probes and scrapes,
// reached from inside the cluster only, uses EvictableAfterProbes
// (100 ms) instead: time for the server to read a probe's request before
// a newcomer may cut it, and idle connections held against it are cleared
// ten times faster than with a second, at the price of more churn under a
// flood aimed at it.
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
	BodyStallTimeoutDefault  = 3 * time.Second
	MinBodyRateDefault       = 1 << 10
	EvictableAfterDefault    = time.Second
)

// EvictableAfterProbes is Config.EvictableAfter for a listener of probes
// and scrapes that only the cluster reaches; see the package
// documentation.
const EvictableAfterProbes = 100 * time.Millisecond

// ErrSlowBody is the error a request body's Read returns once the body
// arrives more slowly than the listener's floor (Config.BodyStallTimeout,
// Config.MinBodyRate); the connection is closed after the answer.
var ErrSlowBody = errors.New("httpserver: request body arrived too slowly")

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
	// MaxConns caps open connections, of this listener alone. Defaults to
	// 256.
	MaxConns int
	// EvictableAfter is how long, at the cap, a connection must have been
	// idle (without a whole request head yet, or between requests), or
	// its request must have waited for more of its body, before it may be
	// closed for a new one. Defaults to EvictableAfterDefault (1 s); see
	// the package documentation.
	EvictableAfter time.Duration
	// BodyStallTimeout bounds each wait for the next bytes of a request
	// body, and is the grace before MinBodyRate applies. A handler that
	// never reads the body leaves its client this long to send the rest
	// before the connection is closed. Defaults to 3 s.
	BodyStallTimeout time.Duration
	// MinBodyRate is the slowest, in bytes per second, a request body may
	// arrive on average over the time the handler waits for it, beyond
	// the first BodyStallTimeout. Defaults to 1 KiB/s.
	MinBodyRate int
	// RefuseBodies answers any request that carries a body 413 and closes
	// its connection without reading the body: for listeners whose routes
	// take none (probes, metrics).
	RefuseBodies bool
	// RefuseBodiesOn does what RefuseBodies does for requests to these
	// paths only (exact paths such as "/metrics", whatever the method):
	// for a listener whose probes and metrics take no body but other
	// routes do (enqueue serve's admin listener).
	RefuseBodiesOn []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server is a listening HTTP server.
type Server struct {
	http   *http.Server
	ln     *limitListener
	logger *slog.Logger
	// The body rate floor.
	stall time.Duration
	rate  int
	// noBodies are the paths whose requests may carry no body
	// (Config.RefuseBodiesOn); every path with Config.RefuseBodies.
	noBodies    map[string]bool
	noBodiesAll bool
	// slowBodies counts bodies cut by the rate floor as a handler read
	// them, and bodies refused.
	slowBodies atomic.Int64
	// refused counts refusals answered before their request's body ended.
	refused atomic.Int64
}

// Listen binds cfg.Addr and returns the server, not yet serving.
func Listen(cfg Config) (*Server, error) {
	if cfg.Handler == nil {
		return nil, errors.New("httpserver: Handler is required")
	}
	if cfg.MaxConns < 0 || cfg.MaxHeaderBytes < 0 || cfg.MinBodyRate < 0 || cfg.BodyStallTimeout < 0 || cfg.EvictableAfter < 0 {
		return nil, errors.New("httpserver: MaxConns, MaxHeaderBytes, MinBodyRate, BodyStallTimeout and EvictableAfter must not be negative")
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	logger := cmp.Or(cfg.Logger, slog.Default())
	ll := newLimitListener(ln, cmp.Or(cfg.MaxConns, MaxConnsDefault), cmp.Or(cfg.EvictableAfter, EvictableAfterDefault))
	s := &Server{
		ln: ll, logger: logger,
		stall:    cmp.Or(cfg.BodyStallTimeout, BodyStallTimeoutDefault),
		rate:     cmp.Or(cfg.MinBodyRate, MinBodyRateDefault),
		noBodies: make(map[string]bool, len(cfg.RefuseBodiesOn)), noBodiesAll: cfg.RefuseBodies,
	}
	for _, p := range cfg.RefuseBodiesOn {
		s.noBodies[p] = true
	}
	handler := s.guardBodies(cfg.Handler)
	s.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: cmp.Or(cfg.ReadHeaderTimeout, ReadHeaderTimeoutDefault),
		ReadTimeout:       cmp.Or(cfg.ReadTimeout, ReadTimeoutDefault),
		WriteTimeout:      cmp.Or(cfg.WriteTimeout, WriteTimeoutDefault),
		IdleTimeout:       cmp.Or(cfg.IdleTimeout, IdleTimeoutDefault),
		MaxHeaderBytes:    cmp.Or(cfg.MaxHeaderBytes, MaxHeaderBytesDefault),
		ConnState:         ll.track,
		ConnContext:       withConn,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	return s, nil
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

// Evicted returns how many connections, idle or stalled, were closed to
// make room for new ones.
func (s *Server) Evicted() int64 { return s.ln.evicted.Load() }

// SlowBodiesCut returns how many request bodies were cut, as their handler
// read them, for arriving too slowly, and, with RefuseBodies or
// RefuseBodiesOn, how many were refused. (A body the handler never reads
// is cut by the same deadline but not counted.)
func (s *Server) SlowBodiesCut() int64 { return s.slowBodies.Load() }

// RefusedUnread returns how many requests were refused (answered 400 or
// more) before their body ended, and so answered at once and their
// connection closed without reading the rest.
func (s *Server) RefusedUnread() int64 { return s.refused.Load() }

// limitListener caps open connections; see the package documentation.
type limitListener struct {
	net.Listener
	max     int
	grace   time.Duration // Config.EvictableAfter
	freed   chan struct{} // a connection closed or lingers (buffered 1: Accept is the only waiter)
	done    chan struct{} // the listener closed
	once    sync.Once
	evicted atomic.Int64
	waited  atomic.Int64 // times a new connection waited at the cap

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func newLimitListener(ln net.Listener, max int, grace time.Duration) *limitListener {
	return &limitListener{
		Listener: ln, max: max, grace: grace,
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
	// waitingBody is when the handler began waiting, still, for more of
	// the request body (zero: it is not waiting).
	waitingBody time.Time
	// refused: its request was refused and answered; the connection only
	// lingers before it closes (see CloseWrite).
	refused bool

	// deadlineMu guards serverRead, the read deadline the server (or a
	// handler through http.ResponseController) last set: the body guard
	// tightens the connection's deadline while it waits for a body and
	// restores this one after.
	deadlineMu sync.Mutex
	serverRead time.Time
}

// SetReadDeadline records and applies a read deadline set by the server.
func (c *trackedConn) SetReadDeadline(t time.Time) error {
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	c.serverRead = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline records and applies read and write deadlines set by the
// server.
func (c *trackedConn) SetDeadline(t time.Time) error {
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	c.serverRead = t
	return c.Conn.SetDeadline(t)
}

// tightenRead sets the read deadline to t, or to the server's if that is
// sooner, and returns the one set.
func (c *trackedConn) tightenRead(t time.Time) time.Time {
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	if !c.serverRead.IsZero() && c.serverRead.Before(t) {
		t = c.serverRead
	}
	_ = c.Conn.SetReadDeadline(t)
	return t
}

// restoreRead puts back the server's read deadline.
func (c *trackedConn) restoreRead() {
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	_ = c.Conn.SetReadDeadline(c.serverRead)
}

// CloseWrite half-closes the connection, if it can: net/http does so
// before it closes a connection whose request body it did not read, so
// that its answer is not lost to a reset.
//
// The connection then only lingers, its answer sent, before net/http
// closes it: at the cap it is closed at once for a newcomer.
func (c *trackedConn) CloseWrite() error {
	c.lingering()
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
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
		victim, recheck := l.victimLocked(time.Now())
		l.mu.Unlock()
		if victim != nil {
			l.evicted.Add(1)
			_ = victim.Close()
			continue
		}
		l.waited.Add(1)
		select {
		case <-l.freed:
		case <-time.After(recheck): // a connection becomes evictable
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
}

// victimLocked returns the connection to close for a new one: one whose
// request was refused and answered (it only lingers), else the one idle
// the longest, else the one whose request has waited longest for more of
// its body, if that one has been so for the grace (Config.EvictableAfter).
// Otherwise it returns nil and how long to wait, unless a connection
// closes before, for the next one to become evictable (at most the grace:
// a connection whose handler is at work may become idle meanwhile).
func (l *limitListener) victimLocked(now time.Time) (*trackedConn, time.Duration) {
	var idle, stalled *trackedConn
	for c := range l.conns {
		switch {
		case c.refused:
			return c, 0
		case c.state == http.StateNew || c.state == http.StateIdle:
			if idle == nil || c.since.Before(idle.since) {
				idle = c
			}
		case !c.waitingBody.IsZero():
			if stalled == nil || c.waitingBody.Before(stalled.waitingBody) {
				stalled = c
			}
		}
	}
	wait := l.grace
	if idle != nil {
		left := l.grace - now.Sub(idle.since)
		if left <= 0 {
			return idle, 0
		}
		wait = min(wait, left)
	}
	if stalled != nil {
		left := l.grace - now.Sub(stalled.waitingBody)
		if left <= 0 {
			return stalled, 0
		}
		wait = min(wait, left)
	}
	return nil, wait
}

// waitBody records that c's handler waits for more of the request body
// (waiting) or got it.
func (c *trackedConn) waitBody(waiting bool) {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	c.waitingBody = time.Time{}
	if waiting {
		c.waitingBody = time.Now()
	}
}

// lingering records that c's answer is sent and it waits only to close.
// A new connection waiting at the cap is told, as when one closes.
func (c *trackedConn) lingering() {
	c.l.mu.Lock()
	c.refused = true
	c.l.mu.Unlock()
	select {
	case c.l.freed <- struct{}{}:
	default:
	}
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
