package httpserver

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// connKey carries a request's *trackedConn in its context.
type connKey struct{}

func withConn(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// aLongTimeAgo is a read deadline that fails every read at once.
var aLongTimeAgo = time.Unix(1, 0)

// refuseBodies answers a request that carries a body 413 and closes the
// connection without reading the body; see Config.RefuseBodies.
func (s *Server) refuseBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		if tc, ok := r.Context().Value(connKey{}).(*trackedConn); ok {
			// The server would otherwise read what is left of the body,
			// however slowly it comes, before closing.
			tc.tightenRead(aLongTimeAgo)
		}
		s.slowBodies.Add(1)
		w.Header().Set("Connection", "close")
		http.Error(w, "this listener takes no request body", http.StatusRequestEntityTooLarge)
	})
}

// guardBodies holds each request body to the rate floor; see
// Config.BodyStallTimeout and Config.MinBodyRate.
func (s *Server) guardBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tc, ok := r.Context().Value(connKey{}).(*trackedConn)
		if r.ContentLength == 0 || !ok {
			next.ServeHTTP(w, r)
			return
		}
		// A handler that never reads the body leaves the client the stall
		// timeout to send it, so that the server, which reads what is
		// left before it closes or reuses the connection, is not held
		// until the read timeout.
		tc.tightenRead(time.Now().Add(s.stall))
		r.Body = &bodyGuard{ReadCloser: r.Body, s: s, conn: tc, remote: r.RemoteAddr}
		next.ServeHTTP(w, r)
	})
}

// bodyGuard is a request body that sets the connection's read deadline
// before each read: the stall timeout, or sooner when the body has fallen
// behind the minimum rate. Only the time spent inside Read counts. Once the
// body ends, the server's own deadline is restored.
type bodyGuard struct {
	io.ReadCloser
	s      *Server
	conn   *trackedConn
	remote string
	read   int64         // bytes read so far
	waited time.Duration // time spent inside Read
	done   bool          // the body ended or was cut
}

func (g *bodyGuard) Read(p []byte) (int, error) {
	if g.done {
		return g.ReadCloser.Read(p)
	}
	earned := time.Duration(float64(g.read) / float64(g.s.rate) * float64(time.Second))
	allowance := min(g.s.stall, g.s.stall+earned-g.waited)
	if allowance <= 0 {
		return 0, g.cut()
	}
	start := time.Now()
	deadline := g.conn.tightenRead(start.Add(allowance))
	g.conn.waitBody(true)
	n, err := g.ReadCloser.Read(p)
	g.conn.waitBody(false)
	g.waited += time.Since(start)
	g.read += int64(n)
	switch {
	case err == io.EOF:
		g.done = true
		g.conn.restoreRead()
	case errors.Is(err, os.ErrDeadlineExceeded) && deadline.Equal(start.Add(allowance)):
		// Our deadline, not the server's read timeout, ended the read.
		return n, g.cut()
	}
	return n, err
}

// cut ends the body: the connection's reads fail from now on, so the
// server closes it after the handler answers.
func (g *bodyGuard) cut() error {
	g.done = true
	g.conn.tightenRead(aLongTimeAgo)
	g.s.slowBodies.Add(1)
	g.s.logger.Debug("request body too slow: connection cut", "remote_addr", g.remote,
		"bytes_read", g.read, "waited_seconds", g.waited.Round(time.Millisecond).Seconds(), "min_body_rate", g.s.rate)
	return ErrSlowBody
}
