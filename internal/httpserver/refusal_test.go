package httpserver

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// answer reads the answer to a request already sent on c, giving up after
// 30 s, and returns how long it took to come, the answer, and whether the
// server then closed the connection (within 10 s).
func answer(t *testing.T, c net.Conn) (time.Duration, *http.Response, bool) {
	t.Helper()
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(start.Add(30*time.Second)))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	took := time.Since(start)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = br.ReadByte()
	return took, resp, err == io.EOF
}

// TestRefusalsAreSentWithoutTheBody: a request refused before its body
// arrived — by its handler (401), by the mux (404, 405), or by a handler
// that gives up on a body too large (413) — is answered at once, with
// Connection: close, and its connection closed, however slowly the rest of
// its body would come. net/http first read what is left of an unread body
// (up to 256 KiB), for as long as the client took to send it: the refusal
// came after the stall timeout (here 20 s, 3 s by default), which let a
// flood of slow senders hold the public port's connections, and its
// probes, behind answers already decided. An answer below 400, and a
// refusal after the whole body was read, keep the connection.
func TestRefusalsAreSentWithoutTheBody(t *testing.T) {
	t.Parallel()
	const stall = 20 * time.Second
	s := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("POST /auth", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "unauthenticated", http.StatusUnauthorized) // never reads the body
		})
		mux.HandleFunc("POST /small", func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 10)); err != nil {
				http.Error(w, "too large", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "bad input", http.StatusBadRequest) // read it all, then refused
		})
		mux.HandleFunc("POST /accept", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusAccepted) // never reads the body, but accepts
		})
	}), ReadTimeout: time.Hour, BodyStallTimeout: stall})
	addr := s.Addr().String()

	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/auth", http.StatusUnauthorized},
		{"PUT", "/auth", http.StatusMethodNotAllowed},
		{"POST", "/nowhere", http.StatusNotFound},
		{"POST", "/small", http.StatusRequestEntityTooLarge},
	} {
		for _, framing := range []string{"Content-Length: 100000\r\n\r\n" + strings.Repeat("a", 50), "Transfer-Encoding: chunked\r\n\r\n20\r\n0123456789abcdef"} {
			c := dial(t, addr, 1)[0]
			_, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\n%s", tc.method, tc.path, framing) // the rest of the body never comes
			require.NoError(t, err)
			took, resp, closed := answer(t, c)
			t.Logf("%s %s (%s): %d after %s", tc.method, tc.path, strings.SplitN(framing, ":", 2)[0], resp.StatusCode, took.Round(time.Millisecond))
			require.Equal(t, tc.status, resp.StatusCode)
			require.Less(t, took, stall/4, "answered at once, not after the stall timeout")
			require.True(t, resp.Close, "Connection: close")
			require.True(t, closed, "the connection is closed after the answer")
		}
	}
	require.EqualValues(t, 8, s.RefusedUnread())

	// Accepted without reading the body: net/http's own way (it reads
	// the rest, within the stall timeout, to keep the connection).
	c := dial(t, addr, 1)[0]
	_, err := io.WriteString(c, "POST /accept HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.False(t, resp.Close)

	// Refused after the whole body was read: the connection is kept.
	br := bufio.NewReader(c)
	for range 2 {
		_, err = io.WriteString(c, "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde")
		require.NoError(t, err)
		resp, err = http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.False(t, resp.Close, "kept alive")
	}
	require.EqualValues(t, 8, s.RefusedUnread())
}

// TestRefuseBodiesOnSomePaths: with RefuseBodiesOn, a request to one of
// those paths that carries a body is answered 413 at once and its
// connection closed, whatever its method (the mux would answer a POST to
// a GET route 405, after the body); other paths take bodies.
func TestRefuseBodiesOnSomePaths(t *testing.T) {
	t.Parallel()
	s := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "read %d bytes", len(b))
		})
	}), RefuseBodiesOn: []string{"/healthz", "/metrics"}, ReadTimeout: time.Hour, BodyStallTimeout: time.Hour})
	addr := s.Addr().String()
	for _, head := range []string{
		"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx",
		"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx",
		"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n",
	} {
		c := dial(t, addr, 1)[0]
		_, err := io.WriteString(c, head)
		require.NoError(t, err)
		took, resp, closed := answer(t, c)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, head)
		require.Less(t, took, 5*time.Second)
		require.True(t, closed)
	}
	require.EqualValues(t, 3, s.SlowBodiesCut())
	require.Equal(t, http.StatusOK, get(t, addr, "/healthz"), "without a body")

	resp, err := http.Post("http://"+addr+"/read", "text/plain", strings.NewReader("hello"))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "read 5 bytes", string(b), "other paths take bodies")
}

// TestRefusedConnectionsMakeRoomAtOnce: a connection whose request was
// refused and answered only lingers before it closes (net/http waits half
// a second so the answer is not lost to a reset); at the cap it is the
// first a newcomer closes, at once, and a newcomer already waiting there
// is told. Here the newcomer waits behind a cap of one, held by a request
// whose handler is at work; once that request is refused, the newcomer
// takes its slot — it waited for the close (or for EvictableAfter, here an
// hour) before — and the refused client still reads its answer.
func TestRefusedConnectionsMakeRoomAtOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	working := make(chan struct{})
	s := start(t, Config{Handler: healthMux(func(mux *http.ServeMux) {
		mux.HandleFunc("POST /auth", func(w http.ResponseWriter, _ *http.Request) {
			close(working)
			<-release
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
		})
	}), MaxConns: 1, EvictableAfter: time.Hour, ReadTimeout: time.Hour, BodyStallTimeout: time.Hour})
	addr := s.Addr().String()

	refused := dial(t, addr, 1)[0]
	_, err := io.WriteString(refused, "POST /auth HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
	require.NoError(t, err)
	<-working
	newcomer := make(chan int, 1)
	go func() { newcomer <- get(t, addr, "/healthz") }()
	require.Eventually(t, func() bool { return s.ln.waited.Load() >= 1 }, 30*time.Second, 10*time.Millisecond, "the newcomer waits at the cap")
	close(release)
	_, resp, _ := answer(t, refused)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the refused client reads its answer")
	require.Equal(t, http.StatusOK, <-newcomer)
	require.EqualValues(t, 1, s.Evicted(), "the refused connection made room, not its close")
}
