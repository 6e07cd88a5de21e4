package chaos

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target, and can
// stall them (no bytes pass, as in a network partition), cut them, or
// partition the path (cut them and refuse new ones for a while).
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
			for p.stalled && !p.closed {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break // EOF or a cut connection: close both sides
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
