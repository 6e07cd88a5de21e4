package httpserver

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
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

// guardBodies holds each request body to the rate floor (see
// Config.BodyStallTimeout and Config.MinBodyRate), refuses bodies where
// none is taken (Config.RefuseBodies, Config.RefuseBodiesOn), and sends
// every refusal of a request whose body has not ended at once (see
// refusal).
func (s *Server) guardBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tc, ok := r.Context().Value(connKey{}).(*trackedConn)
		if r.ContentLength == 0 || !ok {
			next.ServeHTTP(w, r)
			return
		}
		if s.noBodiesAll || s.noBodies[r.URL.Path] {
			s.slowBodies.Add(1)
			rw := &refusal{ResponseWriter: w, s: s}
			http.Error(rw, "this route takes no request body", http.StatusRequestEntityTooLarge)
			tc.tightenRead(aLongTimeAgo)
			return
		}
		// A handler that never reads the body leaves the client the stall
		// timeout to send it, so that the server, which reads what is
		// left before it closes or reuses the connection, is not held
		// until the read timeout.
		tc.tightenRead(time.Now().Add(s.stall))
		g := &bodyGuard{ReadCloser: r.Body, s: s, conn: tc, remote: r.RemoteAddr, length: r.ContentLength}
		r.Body = g
		rw := &refusal{ResponseWriter: w, s: s, body: g}
		next.ServeHTTP(rw, r)
		if rw.refused {
			// The server would otherwise read what is left of the body,
			// however slowly it comes, after the answer, before it closes.
			tc.tightenRead(aLongTimeAgo)
		}
	})
}

// refusal is the ResponseWriter of a request with a body. An answer of
// 400 or more written before the body ended (a refusal: 401, 403, 404,
// 405, 413…) is sent at once, without the rest of the body: net/http
// would first read what is left of it (up to 256 KiB), for as long as the
// client takes to send it, so a slow sender's refusal came only after the
// stall timeout and held its connection busy until then. The connection
// is closed after the answer, half-closed first and left to linger half a
// second (net/http's way, so the answer is not lost to a reset while the
// client is still sending), during which, at the cap, a newcomer may close
// it.
type refusal struct {
	http.ResponseWriter
	s       *Server
	body    *bodyGuard // nil: the body is refused unread
	wrote   bool
	refused bool
}

func (w *refusal) WriteHeader(code int) {
	if !w.wrote && code >= http.StatusOK {
		w.wrote = true
		if code >= http.StatusBadRequest && (w.body == nil || !w.body.ended()) {
			w.refused = true
			w.s.refused.Add(1)
			closeUnread(w.ResponseWriter)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *refusal) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Flush flushes the answer, if the writer underneath can.
func (w *refusal) Flush() {
	w.wrote = true
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *refusal) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// closeUnread tells net/http's ResponseWriter w that the request body will
// not be read: the answer says Connection: close, is sent without reading
// what is left of the body, and the connection is half-closed and closed
// after it. net/http does this for a body beyond http.MaxBytesReader's
// limit, which is the only way to ask for it: a MaxBytesReader of limit 0
// over one byte reaches it.
func closeUnread(w http.ResponseWriter) {
	_, _ = http.MaxBytesReader(w, io.NopCloser(strings.NewReader("x")), 0).Read(make([]byte, 1))
	w.Header().Set("Connection", "close") // whatever w is
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
	length int64         // the request's Content-Length (-1: unknown)
	read   int64         // bytes read so far
	waited time.Duration // time spent inside Read
	done   bool          // the body ended or was cut
}

// ended reports whether the whole body has been read (or was cut).
func (g *bodyGuard) ended() bool { return g.done || g.length > 0 && g.read >= g.length }

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
