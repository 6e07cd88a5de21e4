// Package httpservertest holds, for tests, the red team's attack on the
// listeners of internal/httpserver and the probe that measures it: a flood
// of reconnecting slow senders, and a kubelet-like prober. Both reach
// loopback addresses only, run for a bounded time and stop by themselves.
// The flood is what one machine can do to itself: its clients share the
// machine's CPU with the server they flood, which a remote attacker's
// would not.
package httpservertest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// FloodConfig configures a flood.
type FloodConfig struct {
	// Addr is the loopback address to flood, such as "127.0.0.1:8080".
	Addr string
	// Clients is how many connections the flood keeps open (or queued in
	// the server's accept queue) at once.
	Clients int
	// For is how long the flood lasts.
	For time.Duration
	// Heads are what the clients send on each connection, client i
	// sending Heads[i%len(Heads)]: nothing (""), part of a request head,
	// or a head announcing a body. After a head, the client sends one
	// byte every 500 ms (the rest of the head, or the body, arriving
	// slowly); after nothing, nothing. Defaults to nothing.
	Heads []string
}

// Flood is a flood of reconnecting slow senders: each client opens a
// connection, sends its head and then one byte every 500 ms, and, as soon
// as the server closes the connection, opens another.
type Flood struct {
	dials  atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
}

// StartFlood starts a flood; it stops by itself after cfg.For.
func StartFlood(cfg FloodConfig) (*Flood, error) {
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("httpservertest: %s is not a loopback address", cfg.Addr)
	}
	heads := cfg.Heads
	if len(heads) == 0 {
		heads = []string{""}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.For)
	f := &Flood{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		head := heads[i%len(heads)]
		wg.Go(func() {
			dialer := net.Dialer{Timeout: 5 * time.Second}
			for ctx.Err() == nil {
				c, err := dialer.DialContext(ctx, "tcp", cfg.Addr)
				if err != nil {
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				f.dials.Add(1)
				sendSlowly(ctx, c, head)
			}
		})
	}
	go func() {
		wg.Wait()
		cancel()
		close(f.done)
	}()
	return f, nil
}

// sendSlowly sends head on c, then a byte every 500 ms, until the server
// closes c or ctx ends.
func sendSlowly(ctx context.Context, c net.Conn, head string) {
	defer c.Close()
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c) // until the server closes c
		close(closed)
	}()
	if head != "" {
		_, _ = io.WriteString(c, head)
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.Close()
			<-closed
			return
		case <-closed:
			return
		case <-tick.C:
			if head != "" {
				_, _ = c.Write([]byte("x"))
			}
		}
	}
}

// Dials returns how many connections the flood has opened: its clients'
// first ones and one for every connection the server closed.
func (f *Flood) Dials() int64 { return f.dials.Load() }

// Done is closed once the flood is over and its connections closed.
func (f *Flood) Done() <-chan struct{} { return f.done }

// Stop ends the flood early and waits for its connections to close.
func (f *Flood) Stop() {
	f.cancel()
	<-f.done
}

// Probes are the results of Probe.
type Probes struct {
	// Latencies are those of the probes answered 200, in order.
	Latencies []time.Duration
	// Failures describe the other probes: an error, or another status.
	Failures []string
}

// Probe GETs url on a new connection every interval until done closes,
// as a kubelet probes, but waiting up to 10 s for each answer, so that a
// slow one is measured rather than cut.
func Probe(url string, interval time.Duration, done <-chan struct{}) Probes {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var p Probes
	for {
		select {
		case <-done:
			return p
		case <-time.After(interval):
		}
		start := time.Now()
		resp, err := client.Get(url)
		took := time.Since(start)
		switch {
		case err != nil:
			p.Failures = append(p.Failures, fmt.Sprintf("after %s: %v", took.Round(time.Millisecond), err))
			continue
		case resp.StatusCode != http.StatusOK:
			p.Failures = append(p.Failures, fmt.Sprintf("after %s: %s", took.Round(time.Millisecond), resp.Status))
		default:
			p.Latencies = append(p.Latencies, took)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// Total is how many probes were sent.
func (p Probes) Total() int { return len(p.Latencies) + len(p.Failures) }

// Within is how many probes were answered 200 within d.
func (p Probes) Within(d time.Duration) int {
	n := 0
	for _, l := range p.Latencies {
		if l <= d {
			n++
		}
	}
	return n
}

// Slowest is the longest a probe answered 200 took.
func (p Probes) Slowest() time.Duration {
	if len(p.Latencies) == 0 {
		return 0
	}
	return slices.Max(p.Latencies)
}

// String summarises the probes: how many, their median, 90th percentile
// and slowest latency, and the first failures.
func (p Probes) String() string {
	l := slices.Sorted(slices.Values(p.Latencies))
	at := func(q int) time.Duration {
		if len(l) == 0 {
			return 0
		}
		return l[(len(l)-1)*q/100].Round(time.Millisecond)
	}
	s := fmt.Sprintf("%d probes, %d answered 200 (%d within 1 s): p50 %s, p90 %s, slowest %s", p.Total(), len(l), p.Within(time.Second), at(50), at(90), at(100))
	if len(p.Failures) > 0 {
		s += fmt.Sprintf("; %d failed: %s", len(p.Failures), strings.Join(p.Failures[:min(3, len(p.Failures))], "; "))
	}
	return s
}
