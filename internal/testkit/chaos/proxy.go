package chaos

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target, and can
// stall them (no bytes pass, as in a network partition), cut them,
// partition the path (cut them and refuse new ones for a while), or
// blackhole it (nothing passes and nothing is closed: the target's host
// is gone, as far as its clients can tell).
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	conns   map[net.Conn]struct{}
	closed  bool
	// partitioned refuses new connections; partitions counts Partition
	// calls, so a heal scheduled by an earlier one ends no later one.
	partitioned bool
	partitions  int
	// blackholed holds every byte, close and new connection; blackholes
	// counts Blackhole calls, as partitions does.
	blackholed bool
	blackholes int
}

// NewProxy listens on 127.0.0.1 and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) handle(client net.Conn) {
	p.mu.Lock()
	refused := p.partitioned
	p.mu.Unlock()
	if refused {
		client.Close()
		return
	}
	if p.holdNew(client) {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client) || !p.track(server) {
		client.Close()
		server.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(server, client) }()
	go func() { defer wg.Done(); p.pipe(client, server) }()
	wg.Wait()
	p.untrack(client)
	p.untrack(server)
}

// pipe copies src to dst, holding each chunk while the proxy is stalled.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for (p.stalled || p.blackholed) && !p.closed {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			// EOF or a cut connection: close both sides, but not while
			// blackholed, when nothing reaches the other side, not even
			// a close.
			p.mu.Lock()
			for p.blackholed && !p.closed {
				p.cond.Wait()
			}
			p.mu.Unlock()
			break
		}
	}
	dst.Close()
	src.Close()
}

// Stall holds all traffic for d, then lets it flow again. It returns at once.
func (p *Proxy) Stall(d time.Duration) {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
	time.AfterFunc(d, func() {
		p.mu.Lock()
		p.stalled = false
		p.cond.Broadcast()
		p.mu.Unlock()
	})
}

// Cut closes every open connection; new ones are accepted.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		c.Close()
	}
	return n / 2
}

// Partition cuts every open connection and refuses new ones (each is
// closed as soon as it is accepted, before anything reaches the target)
// for d, or until Heal. It returns at once. Unlike a stall, nothing a
// connection carried before it is delivered afterwards.
func (p *Proxy) Partition(d time.Duration) {
	p.mu.Lock()
	p.partitioned = true
	p.partitions++
	n := p.partitions
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	time.AfterFunc(d, func() {
		p.mu.Lock()
		if p.partitions == n {
			p.partitioned = false
		}
		p.mu.Unlock()
	})
}

// holdNew keeps a connection accepted while the proxy is blackholed, as a
// host that is gone would (nothing answers, nothing is refused), until the
// blackhole ends, then closes it. It reports whether it did.
func (p *Proxy) holdNew(client net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.blackholed {
		return false
	}
	if p.closed {
		client.Close()
		return true
	}
	p.conns[client] = struct{}{}
	for p.blackholed && !p.closed {
		p.cond.Wait()
	}
	delete(p.conns, client)
	client.Close()
	return true
}

// Blackhole makes the target's host vanish for d, or until EndBlackhole:
// no byte passes either way, a connection the target closes is not closed
// on the client's side, and new connections are accepted but never reach
// the target. Clients find out only by their own timeouts. When it ends,
// every connection is closed (a host that comes back resets what its
// clients still hold). It returns at once.
func (p *Proxy) Blackhole(d time.Duration) {
	p.mu.Lock()
	p.blackholed = true
	p.blackholes++
	n := p.blackholes
	p.mu.Unlock()
	time.AfterFunc(d, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.blackholes == n {
			p.endBlackhole()
		}
	})
}

// EndBlackhole ends a blackhole at once.
func (p *Proxy) EndBlackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endBlackhole()
}

func (p *Proxy) endBlackhole() {
	if !p.blackholed {
		return
	}
	for c := range p.conns {
		c.Close()
	}
	p.blackholed = false
	p.cond.Broadcast()
}

// Heal ends a partition at once.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.partitioned = false
	p.mu.Unlock()
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.ln.Close()
}
